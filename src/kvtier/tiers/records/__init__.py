"""How a chunk travels below host memory: the record format (``format``), its errors
(``errors``) and the seals that authenticate or encrypt it (``seal``)."""

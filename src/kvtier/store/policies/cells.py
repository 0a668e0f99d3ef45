"""Byte cells allocated as they are written: the table behind ``GhostFilter`` and
``FrequencySketch``.

Both filters hash a key to a few cells of a table sized by the policy's capacity (tens of
cells a slot). Allocating that table up front costs memory in proportion to the capacity,
not to what is stored: 32 GiB at creation for 10**9 slots. So a table starts sparse, a dict
of its nonzero cells that reads 0 where nothing was written (``SparseCells``), and becomes
the ``bytearray`` once the dict would be the larger (``settle``). Both read and write with
``cells[i]``, so the filters' loops are one code for both, and every answer is the same as
the ``bytearray``'s (the cell indices do not change).

>>> cells = new_cells(1024)
>>> cells[7] = 3; cells[7], cells[8], len(cells)
(3, 0, 1)
>>> isinstance(settle(cells, 1024), SparseCells)
True
>>> for i in range(64): cells[i] = 1
>>> dense = settle(cells, 1024); type(dense).__name__, dense[7], dense[100], len(dense)
('bytearray', 1, 0, 1024)
"""

from __future__ import annotations

from collections.abc import Callable

BYTES_PER_SPARSE_CELL = 64
"""About what one written cell costs in a ``SparseCells`` (a dict entry and its index, an
int: 84 bytes measured at 10**5 cells): ``settle`` densifies when
``len(cells) * BYTES_PER_SPARSE_CELL >= size``, so a table never costs much more than the
``bytearray`` would."""


class SparseCells(dict[int, int]):
    """The written (nonzero) cells of a byte table; an absent cell reads 0."""

    def __missing__(self, index: int) -> int:
        return 0


Cells = SparseCells | bytearray


def new_cells(size: int) -> SparseCells:
    """An all-zero table of ``size`` cells, nothing allocated yet (``size`` is checked
    only when the table densifies)."""
    return SparseCells()


def settle(cells: Cells, size: int) -> Cells:
    """``cells`` as a ``bytearray`` of ``size`` once the sparse form would cost more, else
    ``cells`` itself. Call it outside loops that hold the table (it may replace it)."""
    if isinstance(cells, bytearray) or len(cells) * BYTES_PER_SPARSE_CELL < size:
        return cells
    dense = bytearray(size)
    for i, c in cells.items():
        dense[i] = c
    return dense


def map_cells(cells: Cells, table: bytes, keep: Callable[[int], bool] | None = None) -> None:
    """Replace every cell ``c`` by ``table[c]``, in place (callers may hold the table).
    A sparse table drops the cells that become 0, and those for which ``keep`` is false
    (a caller's cells that read as 0 whatever they hold)."""
    if isinstance(cells, bytearray):
        cells[:] = cells.translate(table)
        return
    kept = {i: table[c] for i, c in cells.items() if table[c] and (keep is None or keep(table[c]))}
    cells.clear()
    cells.update(kept)


def max_cell(cells: Cells) -> int:
    """The largest cell (0 for an empty table)."""
    return max(cells.values(), default=0) if isinstance(cells, SparseCells) else max(cells)

"""What a record that fails verification raises, shared by the format and the seals."""


class RecordError(ValueError):
    """A record failed verification: the tier treats it as a miss and drops it."""


class NotARecord(RecordError):
    """Bytes that are not a kvtier record at all (no magic, or a torn header): a tier must
    not delete a file of this kind, which it cannot prove it wrote."""

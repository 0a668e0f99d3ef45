"""The disk tier: chunk records in one bounded directory that survives restarts (``tier``),
and the directory itself: names, temporary files, what is ours (``directory``)."""

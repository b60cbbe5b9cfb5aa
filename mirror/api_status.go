package mirror

// HaltReason names the class of a halt error as the ferry_mirror_halts_total
// metric labels it ("offset_mismatch", "source_truncated", …, "other"), so
// that a status page and the metric use the same words.
func HaltReason(err error) string { return haltReason(err) }

package mirror

import (
	"errors"
	"fmt"
)

// Reasons a partition writer halts. A halted partition stays halted until
// the mirror is restarted or Mirror.Restart gives it a new writer (after an
// operator looked at it): each of these
// means that continuing could make the standby differ from the source.
var (
	// ErrOffsetMismatch means the standby assigned a batch another offset
	// than the batch has on the source: something else wrote to the
	// standby partition, or the writer's position was wrong.
	ErrOffsetMismatch = errors.New("mirror: standby offset differs from source offset")

	// ErrUnsupportedBatch means a source batch cannot be mirrored: a
	// format Ferry does not handle, a batch that does not decode, or a
	// compressed batch the log cleaner rewrote with holes between its
	// records (a broker accepts only consecutive offsets inside a batch)
	// when RecompressCompacted is off.
	ErrUnsupportedBatch = errors.New("mirror: source batch cannot be forwarded unchanged")

	// ErrSourceTruncated means the source log now ends below what was
	// already mirrored (an unclean leader election, or the topic was
	// recreated): the standby holds records the source lost.
	ErrSourceTruncated = errors.New("mirror: source log truncated below the mirrored position")

	// ErrDiverged means the standby's log and the source's log hold
	// different things at the same offset.
	ErrDiverged = errors.New("mirror: standby log diverges from the source")

	// ErrMarkerTwice means the standby holds one transaction marker twice,
	// one after the other, where the source has it once: the standby's
	// transaction coordinator wrote it again after its broker restarted
	// between writing it and recording the transaction complete (Kafka
	// resends such markers, and a partition takes the copy). From there
	// the standby is one offset ahead of the source, which no writer can
	// take back: the topic is copied again (docs/RUNBOOK.md, 5.4).
	ErrMarkerTwice = errors.New("mirror: standby holds a transaction marker twice")

	// ErrRejected means the standby refused a batch for a reason retrying
	// cannot fix (invalid record, timestamp out of range, too large).
	ErrRejected = errors.New("mirror: standby rejected a batch")

	// ErrFenced means another writer took over the partition (its
	// InitProducerId bumped the epoch of this writer's transactional ID).
	ErrFenced = errors.New("mirror: writer fenced by another writer")

	// ErrTooManyOpenTxns means more source transactions were open at once
	// on one partition than the writer has transactional IDs (its four slots).
	ErrTooManyOpenTxns = errors.New("mirror: too many interleaved source transactions")

	// ErrTargetTooOld means the target cluster lacks an API the writers
	// need: DescribeTransactions (KIP-664, Kafka 3.0), with which a
	// writer checks before each append that no later writer took the
	// partition (fence.go). Nothing is written to such a target; it must
	// be upgraded to be mirrored into.
	ErrTargetTooOld = errors.New("mirror: target cluster too old to mirror into")

	// ErrClosed is returned by Run after Close.
	ErrClosed = errors.New("mirror: closed")
)

// HaltError is why a partition writer halted: where, and which of the
// sentinel errors above (Unwrap).
type HaltError struct {
	Topic     string
	Partition int32
	Offset    int64 // the source offset the writer was at
	Detail    string
	Err       error
}

func (e *HaltError) Error() string {
	return fmt.Sprintf("%v: %s[%d] at offset %d: %s", e.Err, e.Topic, e.Partition, e.Offset, e.Detail)
}

func (e *HaltError) Unwrap() error { return e.Err }

// Parted reports whether err halted a writer because the standby holds
// something else than the source from the writer's mirrored offset on
// (PartitionStatus.Mirrored): a batch at another offset, a stray marker.
func Parted(err error) bool {
	return errors.Is(err, ErrOffsetMismatch) || errors.Is(err, ErrDiverged) || errors.Is(err, ErrMarkerTwice)
}

// haltReason is the metric label of a halt error: the one place an error
// class maps to a metric.
func haltReason(err error) string {
	switch {
	case errors.Is(err, ErrOffsetMismatch):
		return "offset_mismatch"
	case errors.Is(err, ErrUnsupportedBatch):
		return "unsupported_batch"
	case errors.Is(err, ErrSourceTruncated):
		return "source_truncated"
	case errors.Is(err, ErrMarkerTwice):
		return "marker_twice"
	case errors.Is(err, ErrDiverged):
		return "diverged"
	case errors.Is(err, ErrRejected):
		return "rejected"
	case errors.Is(err, ErrFenced):
		return "fenced"
	case errors.Is(err, ErrTooManyOpenTxns):
		return "too_many_open_txns"
	case errors.Is(err, ErrHaltedOnRequest):
		return "requested"
	case errors.Is(err, ErrTargetTooOld):
		return "target_too_old"
	}
	return "other"
}

package mirror

import (
	"context"
	"errors"

	"go.uber.org/zap"
)

// Why Restart refused a partition.
var (
	// ErrNotHalted: the partition's writer runs (starting, mirroring,
	// caught up) or stopped with its source topic; only a halted one is
	// restarted.
	ErrNotHalted = errors.New("mirror: partition not halted")
	// ErrNotOwned: the partition is mirrored, but another member writes it
	// (WithOwnership); ask that member.
	ErrNotOwned = errors.New("mirror: partition written by another member")
	// ErrUnknownPartition: no such partition is mirrored (not selected,
	// not on the standby yet, or no such topic or partition).
	ErrUnknownPartition = errors.New("mirror: no such mirrored partition")
	// ErrNotRunning: the mirror is not running (not started yet, or
	// closed).
	ErrNotRunning = errors.New("mirror: not running")
)

// Restart replaces the halted writer of a partition with a new one, as a
// restart of the process would: the new writer takes ownership (fence.go),
// reads the standby's end offset, runs every start-up check (the leader
// epoch, the tail check, open transactions) and copies from there. If what
// halted the old writer is still there, the new one halts again, with the
// same reason. It returns the status the halted writer had.
//
// A halted writer appends nothing (its goroutine has returned), so the
// standby partition may be repaired while it is halted: a standby topic
// deleted and created again (by the sync loop, or an operator) is copied
// from its new end, 0, at the source's offsets.
//
// Errors: ErrNotHalted, ErrNotOwned, ErrUnknownPartition, ErrNotRunning.
func (m *Mirror) Restart(topic string, partition int32) (PartitionStatus, error) {
	// One assign at a time: the writer is replaced as a whole.
	m.assignMu.Lock()
	defer m.assignMu.Unlock()
	key := topicPartition{topic, partition}
	ctx, h, err := m.writerOf(key)
	if err != nil {
		return PartitionStatus{}, err
	}
	st := h.w.Status()
	if st.State != StateHalted {
		return st, ErrNotHalted
	}
	if !m.owns(topic, partition) {
		return st, ErrNotOwned // assign forgets it shortly
	}
	// The halted writer's goroutine has returned or is returning (a halt
	// by the sync loop cancels it): wait, then forget it.
	h.cancel()
	<-h.done
	m.mu.Lock()
	if m.writers[key] == h {
		delete(m.writers, key)
	}
	m.mu.Unlock()
	h.w.retire()
	m.metrics.forget(topic, partition)
	m.log.Info("mirror partition writer restarted by request", zap.String("topic", topic), zap.Int32("partition", partition),
		zap.String("halt_reason", haltReason(st.Err)), zap.Error(st.Err))
	// Its successor skips what the halted one makes needless (fence.go,
	// predecessor): read once its goroutine has returned.
	m.startWriter(ctx, topic, partition, h.w.predecessor())
	return st, nil
}

// ErrHaltedOnRequest is the halt Halt gives a partition: an operator
// stopped its writer, to copy its topic again (the standby topic can be
// deleted only once none of its partitions is written).
var ErrHaltedOnRequest = errors.New("mirror: halted on request")

// Halt stops a partition's writer and leaves it halted, as a writer that
// found a fault does: it appends nothing more once Halt returns, and
// Restart gives it a new one. It returns the status the writer had. A
// partition already halted stays as it is (its reason kept). Ownership
// moving the partition to another member starts a writer there, which
// knows nothing of this halt.
//
// Errors: ErrNotOwned, ErrUnknownPartition, ErrNotRunning.
func (m *Mirror) Halt(topic string, partition int32) (PartitionStatus, error) {
	m.assignMu.Lock()
	defer m.assignMu.Unlock()
	_, h, err := m.writerOf(topicPartition{topic, partition})
	if err != nil {
		return PartitionStatus{}, err
	}
	st := h.w.Status()
	if st.State == StateHalted {
		return st, nil
	}
	// Its goroutine returns between appends; wait for it, so that
	// nothing reaches the standby after the answer.
	h.cancel()
	<-h.done
	why := &HaltError{Topic: topic, Partition: partition, Offset: st.Mirrored, Err: ErrHaltedOnRequest,
		Detail: "halted on request; restart it (ferry mirror restart) once the standby is repaired"}
	h.w.setState(StateHalted, why)
	m.metrics.halt(topic, partition, why)
	m.log.Info("mirror partition writer halted by request", zap.String("topic", topic), zap.Int32("partition", partition),
		zap.Int64("mirrored_offset", st.Mirrored))
	return st, nil
}

// writerOf is the writer this member runs for key and the mirror's run
// context; m.assignMu is held. Errors: ErrNotRunning, ErrNotOwned,
// ErrUnknownPartition.
func (m *Mirror) writerOf(key topicPartition) (context.Context, *writerHandle, error) {
	m.mu.Lock()
	ctx := m.runCtx
	if m.closed || ctx == nil || ctx.Err() != nil {
		m.mu.Unlock()
		return nil, nil, ErrNotRunning
	}
	h := m.writers[key]
	n, known := m.parts[key.topic]
	m.mu.Unlock()
	if h == nil {
		// Owns is the caller's code: not called under m.mu.
		if known && key.partition >= 0 && key.partition < n && !m.owns(key.topic, key.partition) {
			return nil, nil, ErrNotOwned
		}
		return nil, nil, ErrUnknownPartition
	}
	return ctx, h, nil
}

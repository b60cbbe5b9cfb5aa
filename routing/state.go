package routing

import (
	"fmt"
	"sync/atomic"
)

// State is the routing state every Ferry member agrees on.
type State struct {
	// Generation increases at every switch of the active cluster.
	Generation uint32 `json:"generation"`
	// Active names the physical cluster client traffic goes to.
	Active string `json:"active"`
}

func (s State) String() string {
	return fmt.Sprintf("generation %d, active %q", s.Generation, s.Active)
}

// Table holds the current routing state; readers take a snapshot per request.
type Table struct {
	cur atomic.Pointer[State]
}

// NewTable returns a table at the given state.
func NewTable(s State) *Table {
	t := new(Table)
	t.cur.Store(&s)
	return t
}

// Current returns the routing state in force.
func (t *Table) Current() State { return *t.cur.Load() }

// Advance installs next if its generation is newer than the current one, and
// reports whether it did: an older or equal state never replaces a newer one.
func (t *Table) Advance(next State) bool {
	for {
		cur := t.cur.Load()
		if next.Generation <= cur.Generation {
			return false
		}
		if t.cur.CompareAndSwap(cur, &next) {
			return true
		}
	}
}

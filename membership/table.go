package membership

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

	"github.com/hashicorp/memberlist"
)

// entry is one row of memberlist's node table.
type entry struct {
	node  memberlist.Node // Meta copied
	state State
}

// tableReader reads memberlist's own node table, under memberlist's own
// lock. memberlist's API does not say what the fleet needs to know:
// Members() lists suspect members as alive (Node.State is never set
// there), and its events tell neither a member turning suspect nor a
// dead member from one that left. The table is read by reflection on
// the unexported fields nodeLock and nodes ([]*nodeState, holding Node
// and State); newTableReader checks their names and types, so that a
// memberlist upgrade that changes them fails New (and the tests) instead
// of reading memory wrongly.
type tableReader struct {
	lock     *sync.RWMutex
	nodes    reflect.Value // []*nodeState, settable
	nodeIdx  int           // index of Node in nodeState
	stateIdx int           // index of State in nodeState
}

func newTableReader(ml *memberlist.Memberlist) (*tableReader, error) {
	v := reflect.ValueOf(ml).Elem()
	lf := v.FieldByName("nodeLock")
	if !lf.IsValid() || lf.Type() != reflect.TypeFor[sync.RWMutex]() {
		return nil, errors.New("memberlist.Memberlist has no nodeLock sync.RWMutex")
	}
	nf := v.FieldByName("nodes")
	if !nf.IsValid() || nf.Kind() != reflect.Slice || nf.Type().Elem().Kind() != reflect.Pointer ||
		nf.Type().Elem().Elem().Kind() != reflect.Struct {
		return nil, errors.New("memberlist.Memberlist has no nodes []*struct")
	}
	st := nf.Type().Elem().Elem()
	nodeF, ok1 := st.FieldByName("Node")
	stateF, ok2 := st.FieldByName("State")
	if !ok1 || !ok2 || len(nodeF.Index) != 1 || len(stateF.Index) != 1 ||
		nodeF.Type != reflect.TypeFor[memberlist.Node]() || stateF.Type != reflect.TypeFor[memberlist.NodeStateType]() {
		return nil, fmt.Errorf("memberlist's %s has no Node and State fields", st)
	}
	return &tableReader{
		lock:     (*sync.RWMutex)(lf.Addr().UnsafePointer()),
		nodes:    reflect.NewAt(nf.Type(), nf.Addr().UnsafePointer()).Elem(),
		nodeIdx:  nodeF.Index[0],
		stateIdx: stateF.Index[0],
	}, nil
}

// read returns the table. It takes memberlist's lock: it must not be
// called from a memberlist delegate.
func (t *tableReader) read() []entry {
	t.lock.RLock()
	defer t.lock.RUnlock()
	out := make([]entry, t.nodes.Len())
	for i := range out {
		ns := t.nodes.Index(i).Elem()
		n := ns.Field(t.nodeIdx).Interface().(memberlist.Node)
		n.Meta = append([]byte(nil), n.Meta...)
		n.Addr = append([]byte(nil), n.Addr...)
		out[i] = entry{node: n, state: stateOf(memberlist.NodeStateType(ns.Field(t.stateIdx).Int()))}
	}
	return out
}

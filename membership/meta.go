package membership

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/hashicorp/memberlist"
)

// Meta is what a member tells the others about itself. It travels as
// memberlist node metadata, which is limited to memberlist.MetaMaxSize
// (512) bytes of JSON.
type Meta struct {
	NodeID     int32   `json:"id"`
	Host       string  `json:"host"`            // advertised client host
	Ports      []int32 `json:"ports"`           // advertised client ports (lanes), first one first
	Admin      string  `json:"admin,omitempty"` // admin HTTP address host:port
	Version    string  `json:"version,omitempty"`
	Generation uint32  `json:"gen"` // routing generation the member serves
	// Heartbeats says the member sends liveness heartbeats (liveness.go),
	// so that its silence from its first moment counts. New sets it.
	Heartbeats bool `json:"hb,omitempty"`
	// Starting says the member does not decide automatic failovers:
	// still starting (waiting for a cluster, it is alive in gossip before
	// it serves), or with automatic failover off. A Ferry
	// member gossips it from New, and clears it (SetStarting) once its
	// failover runner runs.
	Starting bool `json:"starting,omitempty"`
}

// Validate reports what makes m unfit to be gossiped.
func (m Meta) Validate() error {
	if m.NodeID < 0 {
		return fmt.Errorf("node ID %d is negative", m.NodeID)
	}
	if m.Host == "" {
		return errors.New("no advertised host")
	}
	if len(m.Ports) == 0 {
		return errors.New("no advertised port")
	}
	for _, p := range m.Ports {
		if p <= 0 || p > math.MaxUint16 {
			return fmt.Errorf("advertised port %d is out of range", p)
		}
	}
	// Checked at the largest generation, so that SetGeneration can never
	// make it too long later.
	m.Generation = math.MaxUint32
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	if len(b) > memberlist.MetaMaxSize {
		return fmt.Errorf("metadata is %d bytes of JSON, more than the %d gossip allows (shorten host, admin or version, or use fewer ports)",
			len(b), memberlist.MetaMaxSize)
	}
	return nil
}

func (m Meta) clone() Meta {
	m.Ports = append([]int32(nil), m.Ports...)
	return m
}

// parseMeta reads a member's metadata and checks that it is the member the
// node name says it is: a memberlist node that is not a Ferry member (or
// speaks another format) is not let in.
func parseMeta(name string, b []byte) (Meta, error) {
	var m Meta
	if err := json.Unmarshal(b, &m); err != nil {
		return Meta{}, fmt.Errorf("node %q: unreadable metadata (not a Ferry member?): %v", name, err)
	}
	if strconv.Itoa(int(m.NodeID)) != name {
		return Meta{}, fmt.Errorf("node %q: metadata says node ID %d", name, m.NodeID)
	}
	if err := m.Validate(); err != nil {
		return Meta{}, fmt.Errorf("node %q: %v", name, err)
	}
	return m, nil
}

// State is what the fleet knows of a member's health.
type State int

const (
	// Alive members answer probes.
	Alive State = iota
	// Suspect members missed probes; they are declared dead unless they
	// refute it in time.
	Suspect
	// Dead members stopped answering (crashed, partitioned away).
	Dead
	// Left members left on purpose (Close).
	Left
)

func (s State) String() string {
	switch s {
	case Alive:
		return "alive"
	case Suspect:
		return "suspect"
	case Dead:
		return "dead"
	case Left:
		return "left"
	}
	return "state(" + strconv.Itoa(int(s)) + ")"
}

// Member is a member of the fleet as this member knows it.
type Member struct {
	Meta
	Addr  string // gossip host:port
	State State
	Self  bool
}

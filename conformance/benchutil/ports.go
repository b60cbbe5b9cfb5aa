package benchutil

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
)

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago (all held open together while they are picked, so none repeats).
func FreePorts(n int) ([]int, error) {
	var ports []int
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// FreeGossipAddr returns a loopback host:port that was free for both TCP
// and UDP a moment ago: a fleet member's gossip address (memberlist binds
// both).
func FreeGossipAddr() (string, error) {
	for range 20 {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return "", err
		}
		addr := ln.Addr().String()
		pc, err := net.ListenPacket("udp", addr)
		ln.Close()
		if err == nil {
			pc.Close()
			return addr, nil
		}
	}
	return "", errors.New("no loopback port free for both TCP and UDP")
}

// WriteGossipKey writes a fleet's gossip key file in dir (base64 of 32
// bytes derived from seed: fleets with different seeds cannot join each
// other) and returns its path.
func WriteGossipKey(dir string, seed byte) (string, error) {
	key := make([]byte, 32)
	for i := range key {
		key[i] = seed + byte(i*7+3)
	}
	path := filepath.Join(dir, fmt.Sprintf("gossip-%d.key", seed))
	return path, os.WriteFile(path, []byte(base64.StdEncoding.EncodeToString(key)+"\n"), 0o600)
}

// FreePortRun returns the first of n consecutive loopback TCP ports that
// were all free a moment ago: a `ferry serve` listen port, whose lanes
// take the ports after it.
func FreePortRun(n int) (int, error) {
	for range 50 {
		ps, err := FreePorts(1)
		if err != nil {
			return 0, err
		}
		var lns []net.Listener
		ok := true
		for i := range n {
			ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(ps[0]+i)))
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if ok {
			return ps[0], nil
		}
	}
	return 0, fmt.Errorf("no run of %d free loopback ports found", n)
}

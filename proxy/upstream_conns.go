package proxy

// Upstream connections are checked out to a client connection for a burst, not
// for its life. A client keeps its connection to a broker while it has
// requests in flight there, so the broker sees them in the order the client
// sent them (idempotent sequences and transactions depend on it), and gives
// it back once nothing is in flight: its next request may then go out on any
// connection without overtaking anything. A client that is connected but
// quiet holds no upstream connection, so the per-broker bound limits the
// clients busy at the same moment, not the clients connected.
//
// Sharing one upstream connection between clients that are busy at the
// same time is not done: a broker serves one request per connection at a
// time, so a long-polling fetch or a JoinGroup parked in a rebalance would
// stall every client behind it.

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ferry-gw/ferry/upstream"
)

// upConn returns this client's connection to a broker of cluster u, checking
// one out when it has none or the one it had died. The caller holds upsMu.
func (c *clientConn) upConn(u *upstream.Cluster, broker int32) (*upstream.Conn, error) {
	k := upKey{u.Name, broker}
	if uc := c.ups[k]; uc != nil {
		switch {
		case uc.Alive() && !uc.Renewing():
			return uc, nil
		case uc.Alive() && !uc.Quiet() && !uc.Expired():
			// The session ends soon: the connection is replaced once
			// nothing is in flight on it, so that nothing overtakes.
			return uc, nil
		case uc.Alive() && !uc.Quiet():
			// Busy up to its session's end: what is in flight is
			// answered on it, new requests go on another.
			uc.Pool.Retire(uc)
			delete(c.ups, k)
		default:
			if !uc.Alive() {
				u.ForgetCoordinatorsOn(broker)
			}
			uc.Pool.Put(uc)
			delete(c.ups, k)
		}
	}
	uc, err := c.checkout(u, broker)
	if err != nil {
		return nil, err
	}
	c.ups[k] = uc
	return uc, nil
}

// checkout takes a connection to a broker of cluster u from its pool, charged
// to this client's budget.
func (c *clientConn) checkout(u *upstream.Cluster, broker int32) (*upstream.Conn, error) {
	p, err := u.Pool(broker, u.PoolIdentity(c.ident))
	if err != nil {
		return nil, err
	}
	return p.Get(c.ctx, c.mem)
}

// maxFetchConns bounds a client's fetch connections to one broker.
const maxFetchConns = 4

// fetchConn returns a connection to a broker with nothing in flight, checking
// one out (up to maxFetchConns) when all are busy, else the least busy. The
// caller holds upsMu.
func (c *clientConn) fetchConn(u *upstream.Cluster, broker int32) (*upstream.Conn, error) {
	k := upKey{u.Name, broker}
	ucs := c.fetchUps[k][:0]
	for _, uc := range c.fetchUps[k] {
		switch {
		case uc.Alive() && uc.Renewing() && uc.Quiet():
			uc.Pool.Put(uc) // its session ends soon (upConn)
		case uc.Alive() && uc.Expired():
			uc.Pool.Retire(uc)
		case uc.Alive():
			ucs = append(ucs, uc)
		default:
			uc.Pool.Put(uc)
		}
	}
	c.fetchUps[k] = ucs
	var best *upstream.Conn
	for _, uc := range ucs {
		if uc.Quiet() && !uc.Renewing() {
			return uc, nil
		}
		if best == nil || len(uc.InFlight) < len(best.InFlight) {
			best = uc
		}
	}
	if len(ucs) >= maxFetchConns {
		return best, nil
	}
	uc, err := c.checkout(u, broker)
	if err != nil {
		return nil, err
	}
	c.fetchUps[k] = append(ucs, uc)
	return uc, nil
}

// releaseQuiet gives back every checked-out connection with nothing in flight.
// The writer calls it when it has answered everything queued, the server's
// give-back loop every second (for clients that stopped reading). It never
// waits: while the reader is checking out or sending, it leaves the
// connections be.
func (c *clientConn) releaseQuiet() {
	if !c.upsMu.TryLock() {
		return
	}
	defer c.upsMu.Unlock()
	c.giveBack(false, upstream.ErrClosed)
}

// releaseUpstreams gives back every checked-out connection; called by the reader
// goroutine once nothing more will be sent, with why it stopped reading.
// Connections with requests in flight are closed by the pool, not kept, and
// those requests fail with errClientClosed wrapping why: the client left (or
// Ferry closed it, for a bad frame), the broker did nothing wrong, and the
// connection's close is counted for why, whichever goroutine reports it.
func (c *clientConn) releaseUpstreams(why error) {
	gone := upstream.ErrClientClosed
	if why != nil {
		gone = fmt.Errorf("%w (%w)", upstream.ErrClientClosed, why)
	}
	c.upsMu.Lock()
	defer c.upsMu.Unlock()
	c.giveBack(true, gone)
}

// giveBack returns to their pools the connections with nothing in flight,
// or every one when all is set (the pool closes a busy one, failing what is
// in flight with why). The caller holds upsMu.
func (c *clientConn) giveBack(all bool, why error) {
	for k, uc := range c.ups {
		if all || uc.Quiet() {
			uc.Pool.Release(uc, why)
			delete(c.ups, k)
		}
	}
	for k, ucs := range c.fetchUps {
		keep := ucs[:0]
		for _, uc := range ucs {
			if all || uc.Quiet() {
				uc.Pool.Release(uc, why)
			} else {
				keep = append(keep, uc)
			}
		}
		if len(keep) == 0 {
			delete(c.fetchUps, k)
		} else {
			c.fetchUps[k] = keep
		}
	}
}

// dropStreamed closes the connection of a fetch whose answer will not be
// written, when the answer may still be on it (not yet arrived, or left
// there to be streamed). An answer read whole left the connection clean,
// and perhaps checked out to another client by now: it is left alone.
func (sc *subCall) dropStreamed() {
	select {
	case <-sc.p.Done:
		if sc.p.Streamed == nil {
			return
		}
	default:
	}
	sc.uc.Close(upstream.ErrClosed)
}

// giveBackLoop returns the quiet connections of clients that stopped reading (their
// writer is blocked and cannot), closes upstream connections idle too long,
// and publishes the pools' sizes.
func (s *Server) giveBackLoop() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	var conns []*clientConn
	published := map[string]bool{} // clusters with pool sizes published
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		conns = conns[:0]
		for c := range s.conns {
			conns = append(conns, c)
		}
		s.mu.Unlock()
		for _, c := range conns {
			c.releaseQuiet()
		}
		ups := s.clusters()
		for _, u := range ups {
			inUse, idle := u.ReapIdle(time.Now().Add(-s.cfg.upstreamIdleTimeout))
			s.metrics.upConns.WithLabelValues(u.Name, "in_use").Set(float64(inUse))
			s.metrics.upConns.WithLabelValues(u.Name, "idle").Set(float64(idle))
			published[u.Name] = true
		}
		for name := range published {
			if ups[name] == nil { // retired (Retire): its series go
				s.metrics.upConns.DeletePartialMatch(prometheus.Labels{"cluster": name})
				delete(published, name)
			}
		}
	}
}

package proxy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/routing"
)

// Server is one Ferry member's Kafka listener: the virtual cluster.
type Server struct {
	cfg     config
	log     *zap.Logger
	routes  *routing.Table
	fleet   Fleet
	ups     map[string]*upstream
	metrics *metrics
	mem     *memBudget

	// lanes is how many virtual brokers each member presents.
	lanes int

	// versions is what Ferry advertises: what it can parse, intersected
	// with what every configured cluster supports.
	versions protocol.Versions

	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	lns    map[net.Listener]struct{}
	conns  map[*clientConn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// New builds a server. Start must succeed before it serves.
func New(opts ...Option) (*Server, error) {
	cfg := defaultConfig()
	for _, o := range opts {
		o(&cfg)
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:    cfg,
		log:    cfg.log,
		routes: cfg.routes,
		fleet:  cfg.fleet,
		ups:    make(map[string]*upstream, len(cfg.clusters)),
		lns:    make(map[net.Listener]struct{}),
		conns:  make(map[*clientConn]struct{}),
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	m, err := newMetrics(cfg.reg)
	if err != nil {
		return nil, err
	}
	s.metrics = m
	s.mem = newMemBudget(&s.cfg, m)
	for _, cl := range cfg.clusters {
		u, err := newUpstream(&s.cfg, cl)
		if err != nil {
			s.Close()
			return nil, err
		}
		u.spawn = s.goTracked
		s.ups[cl.Name] = u
	}
	return s, nil
}

// Start connects to every configured cluster, learns the API versions they
// support and loads their metadata. It retries until ctx ends, logging why a
// cluster is unreachable.
func (s *Server) Start(ctx context.Context) error {
	for name, u := range s.ups {
		for attempt := 0; ; attempt++ {
			err := u.start(ctx)
			if err == nil {
				break
			}
			s.log.Warn("cluster unreachable; retrying", zap.String("cluster", name), zap.Error(err))
			select {
			case <-ctx.Done():
				return fmt.Errorf("cluster %q unreachable: %w", name, err)
			case <-time.After(min(time.Duration(attempt+1)*500*time.Millisecond, 5*time.Second)):
			}
		}
	}
	sets := []protocol.Versions{protocol.KmsgVersions().Only(clientKeys()...)}
	for _, u := range s.ups {
		sets = append(sets, u.versions)
	}
	s.versions = protocol.Intersect(sets...)
	s.lanes = s.cfg.lanes
	if s.lanes == 0 {
		// As many lanes as the largest cluster has brokers: each
		// physical leader gets a virtual broker of its own.
		for _, u := range s.ups {
			s.lanes = max(s.lanes, len(u.snapshot().brokers))
		}
	}
	s.lanes = min(max(s.lanes, 1), laneStride)
	s.goTracked(s.refreshLoop)
	return nil
}

// refreshLoop refreshes upstream metadata periodically.
func (s *Server) refreshLoop() {
	t := time.NewTicker(s.cfg.metadataInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
			for name, u := range s.ups {
				ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
				if _, err := u.refresh(ctx, true); err != nil {
					s.log.Warn("metadata refresh failed", zap.String("cluster", name), zap.Error(err))
				}
				cancel()
			}
		}
	}
}

// goTracked runs f on a goroutine that Close waits for; after Close it does
// not start it.
func (s *Server) goTracked(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// Serve accepts client connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return ErrServerClosed
	}
	s.lns[ln] = struct{}{}
	s.mu.Unlock()
	var backoff time.Duration
	for {
		nc, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return ErrServerClosed
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
				time.Sleep(backoff)
				continue
			}
			return err
		}
		backoff = 0
		if tc, ok := nc.(*net.TCPConn); ok {
			tc.SetNoDelay(true)
		}
		c := s.newClientConn(nc)
		s.mu.Lock()
		if s.closed {
			s.mu.Unlock()
			nc.Close()
			return ErrServerClosed
		}
		s.conns[c] = struct{}{}
		s.wg.Add(1)
		s.mu.Unlock()
		go func() {
			defer s.wg.Done()
			c.serve()
			s.mu.Lock()
			delete(s.conns, c)
			s.mu.Unlock()
		}()
	}
}

// ErrServerClosed is returned by Serve after Close.
var ErrServerClosed = errors.New("ferry: server closed")

// Close stops the server; safe to call more than once. In order: stop
// accepting, close every client connection (in-flight requests end with
// them, as with a broker that stops), wait for every goroutine, then close
// the upstream clients.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for ln := range s.lns {
		ln.Close()
	}
	for c := range s.conns {
		c.close(ErrServerClosed)
	}
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
	for _, u := range s.ups {
		u.close()
	}
	return nil
}

// Lanes is how many virtual brokers each member presents, known after
// Start: the caller serves that many listeners and advertises their ports
// in the fleet (Broker.LanePorts).
func (s *Server) Lanes() int { return s.lanes }

// Versions returns the API versions Ferry advertises.
func (s *Server) Versions() protocol.Versions { return s.versions }

func (c *config) writeTimeout() time.Duration { return 60 * time.Second }

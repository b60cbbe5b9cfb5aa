package admin

import (
	"net/http"
	"net/http/pprof"
)

// handleProfiles serves Go's runtime profiles (net/http/pprof) under
// /debug/pprof/, behind the token like every mutating endpoint: goroutine
// dumps show what every connection is doing, cmdline the command line, and
// a CPU profile or trace costs CPU while it runs. A profile (?seconds=N)
// must end within the server's write timeout (one minute).
//
//	curl -H "Authorization: Bearer $TOKEN" -o heap.pb.gz http://127.0.0.1:9644/debug/pprof/heap
//	go tool pprof -top heap.pb.gz
func (s *Server) handleProfiles() {
	s.mux.Handle("GET /debug/pprof/", s.authorize(http.HandlerFunc(pprof.Index)))
	s.mux.Handle("GET /debug/pprof/cmdline", s.authorize(http.HandlerFunc(pprof.Cmdline)))
	s.mux.Handle("GET /debug/pprof/profile", s.authorize(http.HandlerFunc(pprof.Profile)))
	s.mux.Handle("GET /debug/pprof/symbol", s.authorize(http.HandlerFunc(pprof.Symbol)))
	s.mux.Handle("GET /debug/pprof/trace", s.authorize(http.HandlerFunc(pprof.Trace)))
}

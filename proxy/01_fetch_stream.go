package proxy

// Streaming a large Fetch answer. Reading a broker's answer into Ferry and
// writing it out again costs two copies of every record byte, which on a
// busy machine is most of Ferry's CPU. So the writer streams a
// single-broker answer: the small fields around the records go through a
// buffer and are rewritten in place as fetchWhole would (topic IDs,
// preferred read replica, leader hints; node endpoints zeroed under an
// unknown tag, since their size would change), and the records move from
// the broker's socket to the client's with splice(2), never entering
// Ferry's memory. When the batches need rewriting — leader epochs under a
// generation other than 0, fillers hidden from a cluster the mirror may
// have written into — each batch header (61 bytes) goes through the buffer
// on the way and only the rest of the batch is spliced.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"time"

	"github.com/ferry-gw/ferry/protocol"
	"github.com/ferry-gw/ferry/upstream"
)

// spliceMinBytes is the smallest run of record bytes worth a splice; less
// is copied through the buffers.
const spliceMinBytes = 32 << 10

var streamReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// fetchStream writes the answer to a single-broker fetch to bw when the
// broker's answer was left on its connection to be streamed, and reports
// whether it did; otherwise the answer was read whole and the caller goes
// on with the reply's finish.
func (s *Server) fetchStream(ctx context.Context, c *clientConn, req *request, sc *subCall, byPhys fetchTopics, bw *bufio.Writer) (int64, bool, error) {
	if _, err := s.waitFetchPart(ctx, req, sc.p); err != nil {
		if ctx.Err() != nil || errors.Is(err, upstream.ErrClientClosed) {
			sc.dropStreamed() // its answer may wait to be streamed
			return 0, true, err
		}
		return 0, false, nil // the reply's finish answers (fetchWhole)
	}
	st := sc.p.Streamed
	if st == nil {
		return 0, false, nil
	}
	up := st.Conn.NetConn
	// The broker's bytes wait on the client as much as on the broker: the
	// same bound as for writing any answer to the client.
	up.SetReadDeadline(time.Now().Add(s.settings.Load().WriteTimeout))
	// The bytes the broker connection's reader read ahead come first;
	// the buffer's first fill takes them all (Prefix is smaller than it),
	// so from then on what src does not hold is still on the socket.
	under := &io.LimitedReader{R: up, N: st.Size - int64(len(st.Prefix))}
	src := streamReaders.Get().(*bufio.Reader)
	src.Reset(io.MultiReader(bytes.NewReader(st.Prefix), under))
	defer func() {
		src.Reset(nil)
		streamReaders.Put(src)
	}()

	var head [8]byte
	binary.BigEndian.PutUint32(head[:], uint32(st.Size+4))
	binary.BigEndian.PutUint32(head[4:], uint32(req.hdr.CorrelationID))
	if _, err := bw.Write(head[:]); err != nil {
		st.Finish(err)
		return 0, true, err
	}
	gen := req.state.Generation
	name := ""
	_, err := protocol.StreamFetchResponse(src, bw, req.hdr.Version, st.Size, protocol.FetchStreamHooks{
		Topic: func(t *protocol.FetchTopic) { name = byPhys.virtual(t) },
		// The same rewrite as an answer read whole, in two calls: the
		// windows before the records, then those after them.
		Head: func(_ *protocol.FetchTopic, p *protocol.FetchPartition) {
			s.virtualFetchPartition(req.up, gen, name, p, protocol.BatchRewrite{})
		},
		Tail: func(_ *protocol.FetchTopic, p *protocol.FetchPartition) {
			s.virtualFetchPartition(req.up, gen, name, p, protocol.BatchRewrite{})
		},
		Batches:    s.batchRewrite(req.up, gen),
		MinRecords: spliceMinBytes,
		Records: func(n int64) error {
			if err := bw.Flush(); err != nil {
				return err
			}
			// *net.TCPConn to *net.TCPConn through an io.LimitedReader
			// is spliced by the net package. From a TLS upstream
			// (clusterauth) the bytes are decrypted, so copied.
			m, err := io.Copy(c.nc, &io.LimitedReader{R: up, N: n})
			under.N -= m
			// Counted as it moves, not when the answer ends: the client
			// may have every byte before the writer gets that far.
			if isTCP(up) {
				s.metrics.splicedBytes.Add(float64(m))
			}
			if err == nil && m < n {
				err = io.ErrUnexpectedEOF
			}
			return err
		},
	})
	if err == nil {
		up.SetReadDeadline(time.Time{})
	}
	s.metrics.streamed.Inc()
	st.Finish(err)
	return st.Size + 4, true, err
}

// isTCP reports whether splice(2) can move bytes to or from nc.
func isTCP(nc net.Conn) bool {
	_, ok := nc.(*net.TCPConn)
	return ok
}

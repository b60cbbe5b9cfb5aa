package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/zap"

	"github.com/ferry-gw/ferry/protocol"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// The cost of connection stats on the data path, end to end: clients
// producing through Ferry to an in-process cluster, with stats on and off.
// Compare ns/op and requests/s of the two:
//
//	go test ./proxy -run '^$' -bench 'ConnectionStats$' -benchtime 3s -count 5
//
// sync is one client, one record a round trip (latency-bound: every
// request pays the accounting once); parallel is 16 clients doing the same
// at once on 16 connections (kfake, which serves one request at a time, is
// the limit). local is 4 connections pipelining ApiVersions, which Ferry
// answers itself: no broker, so Ferry's own cost per request is the limit
// and the accounting's share of it shows most.
func BenchmarkConnectionStats(b *testing.B) {
	for _, on := range []bool{true, false} {
		b.Run(fmt.Sprintf("local/stats=%v", on), func(b *testing.B) { benchLocal(b, on) })
	}
	for _, mode := range []string{"sync", "parallel"} {
		for _, on := range []bool{true, false} {
			b.Run(fmt.Sprintf("%s/stats=%v", mode, on), func(b *testing.B) {
				kf := newKfake(b, 1)
				s, addr := startFerry(b, kf.ListenAddrs(), WithConnectionStats(on), WithLogger(zap.NewNop()))
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				defer cancel()
				if _, err := kadm.NewClient(newClient(b, addr)).CreateTopic(ctx, 1, 1, nil, "bench"); err != nil {
					b.Fatal(err)
				}
				clients := 1
				if mode == "parallel" {
					clients = 16
				}
				var cls []*kgo.Client
				for range clients {
					cl := newClient(b, addr, kgo.DefaultProduceTopic("bench"), kgo.ProducerLinger(0), kgo.ProducerBatchCompression(kgo.NoCompression()))
					if err := cl.ProduceSync(ctx, &kgo.Record{Value: []byte("warm")}).FirstErr(); err != nil {
						b.Fatal(err)
					}
					cls = append(cls, cl)
				}
				produces := s.metrics.byKey[kmsg.Produce].requests
				before := testutil.ToFloat64(produces)
				val := make([]byte, 100)
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start := time.Now()
				for _, cl := range cls {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for next.Add(1) <= int64(b.N) {
							if err := cl.ProduceSync(ctx, &kgo.Record{Value: val}).FirstErr(); err != nil {
								b.Error(err)
								return
							}
						}
					}()
				}
				wg.Wait()
				took := time.Since(start)
				b.ReportMetric((testutil.ToFloat64(produces)-before)/took.Seconds(), "requests/s")
			})
		}
	}
}

func benchLocal(b *testing.B, on bool) {
	kf := newKfake(b, 1)
	_, addr := startFerry(b, kf.ListenAddrs(), WithConnectionStats(on), WithLogger(zap.NewNop()))
	const conns, depth = 4, 32
	req := kmsg.NewPtrApiVersionsRequest()
	req.SetVersion(3)
	req.ClientSoftwareName, req.ClientSoftwareVersion = "bench", "1"
	frame := protocol.AppendSize(nil)
	frame = protocol.AppendRequestHeader(frame, req, 1, "bench")
	frame = req.AppendTo(frame)
	protocol.FinishSize(frame, 0)
	burst := bytes.Repeat(frame, depth)
	var ncs []net.Conn
	for range conns {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			b.Fatal(err)
		}
		defer nc.Close()
		ncs = append(ncs, nc)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	for _, nc := range ncs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			br := bufio.NewReaderSize(nc, 64<<10)
			var size [4]byte
			for next.Add(depth) <= int64(b.N)+depth-1 {
				if _, err := nc.Write(burst); err != nil {
					b.Error(err)
					return
				}
				for range depth {
					if _, err := io.ReadFull(br, size[:]); err != nil {
						b.Error(err)
						return
					}
					if _, err := br.Discard(int(binary.BigEndian.Uint32(size[:]))); err != nil {
						b.Error(err)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
}

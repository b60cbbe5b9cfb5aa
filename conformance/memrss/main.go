// Command memrss measures a Ferry process's resident memory under the loads
// that made it grow without bound: several clients each sending a 100 MiB
// request at once, and several clients each pipelining 64 large fetches
// without reading their answers (splice_fetches: false, so answers are read
// into Ferry). Ferry runs as its own process (the binary given with -ferry,
// e.g. from `make build`) in front of an in-process kfake cluster, so only
// Ferry's memory is measured; each scenario gets a fresh Ferry.
//
//	go build -o /tmp/ferry ./cmd/ferry && go run ./conformance/memrss -ferry /tmp/ferry
//
// Everything runs on loopback.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/protocol"
)

func main() {
	ferry := flag.String("ferry", "", "the ferry binary to measure (required)")
	scenarios := flag.String("scenarios", "produce,fetch", "comma-separated: produce (each client sends one 100 MiB produce), fetch (each pipelines -fetches fetches without reading, then reads them), idle (each produces once, then stays connected)")
	clients := flag.Int("clients", 4, "clients at once")
	fetches := flag.Int("fetches", 64, "fetches each client pipelines")
	settle := flag.Duration("settle", 30*time.Second, "how long after the clients closed to measure again")
	extra := flag.String("config", "", "YAML lines added to Ferry's configuration (e.g. budgets)")
	flag.Parse()
	if *ferry == "" {
		flag.Usage()
		os.Exit(2)
	}
	kf, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "mem"))
	if err != nil {
		fatal(err)
	}
	defer kf.Close()
	seed(kf.ListenAddrs()[0])
	for _, sc := range strings.Split(*scenarios, ",") {
		f := startFerry(*ferry, kf.ListenAddrs()[0], *extra)
		base := f.rss()
		start := time.Now()
		switch sc {
		case "produce":
			produce(f.addr, *clients)
		case "fetch":
			fetch(f, *clients, *fetches)
		case "idle":
			idle(f, *clients, base)
		default:
			fatal(fmt.Errorf("unknown scenario %q", sc))
		}
		took := time.Since(start).Round(time.Millisecond)
		peak := f.status("VmHWM")
		closed := f.rss()
		time.Sleep(*settle)
		later := f.rss()
		fmt.Printf("%-8s %d clients: RSS before %4d MiB, peak %+5d MiB, after the clients closed %+5d MiB (ferry_buffered_bytes %s), %v later %+5d MiB (Go heap in use %s) (load took %v)\n",
			sc, *clients, base>>20, (peak-base)>>20, (closed-base)>>20, f.buffered(), *settle, (later-base)>>20, f.metric("go_memstats_heap_inuse_bytes"), took)
		f.stop()
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "memrss:", err)
	os.Exit(1)
}

// seed writes 16 MiB of 64 KiB records for the fetches.
func seed(addr string) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("mem"), kgo.ProducerBatchCompression(kgo.NoCompression()))
	if err != nil {
		fatal(err)
	}
	defer cl.Close()
	ctx := context.Background()
	for i := range 256 {
		cl.Produce(ctx, &kgo.Record{Value: bytes.Repeat([]byte{byte(i)}, 64<<10)}, nil)
	}
	if err := cl.Flush(ctx); err != nil {
		fatal(err)
	}
}

type ferryProc struct {
	cmd   *exec.Cmd
	addr  string
	admin string
}

// buffered returns Ferry's ferry_buffered_bytes ("-" from a Ferry without
// it).
func (f *ferryProc) buffered() string { return f.metric("ferry_buffered_bytes") }

// upstreamConns returns ferry_upstream_connections by state.
func (f *ferryProc) upstreamConns() string {
	resp, err := http.Get("http://" + f.admin + "/metrics")
	if err != nil {
		return "-"
	}
	defer resp.Body.Close()
	var out []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "ferry_upstream_connections{"); ok {
			out = append(out, v)
		}
	}
	return strings.Join(out, "; ")
}

// metric returns a metric of Ferry's /metrics in MiB, or "-".
func (f *ferryProc) metric(name string) string {
	resp, err := http.Get("http://" + f.admin + "/metrics")
	if err != nil {
		return "-"
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return fmt.Sprintf("%.0f MiB", n/(1<<20))
		}
	}
	return "-"
}

func freeAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func startFerry(bin, bootstrap, extra string) *ferryProc {
	dir, err := os.MkdirTemp("", "memrss")
	if err != nil {
		fatal(err)
	}
	addr, admin := freeAddr(), freeAddr()
	cfg := fmt.Sprintf("cluster_id: memrss\nlisten: %s\nadmin_listen: %s\nlanes: 1\nclusters: [{name: a, bootstrap: [%q]}]\nsplice_fetches: false\nlog_level: warn\n%s\n", addr, admin, bootstrap, extra)
	path := filepath.Join(dir, "ferry.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", path)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		fatal(err)
	}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if resp, err := http.Get("http://" + admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			fatal(errors.New("ferry not ready after 30s"))
		}
	}
	return &ferryProc{cmd: cmd, addr: addr, admin: admin}
}

func (f *ferryProc) stop() {
	f.cmd.Process.Signal(os.Interrupt)
	f.cmd.Wait()
}

// status returns a /proc/PID/status field in bytes.
func (f *ferryProc) status(field string) int64 {
	n, err := benchutil.PidStatus(f.cmd.Process.Pid, field)
	if err != nil {
		fatal(err)
	}
	return n
}

func (f *ferryProc) rss() int64 { return f.status("VmRSS") }

func frame(req kmsg.Request, corr int32) []byte {
	b := protocol.AppendSize(nil)
	b = protocol.AppendRequestHeader(b, req, corr, "memrss")
	b = req.AppendTo(b)
	protocol.FinishSize(b, 0)
	return b
}

func readFrame(c net.Conn) error {
	var size [4]byte
	if _, err := io.ReadFull(c, size[:]); err != nil {
		return err
	}
	_, err := io.CopyN(io.Discard, c, int64(binary.BigEndian.Uint32(size[:])))
	return err
}

// produce: each client sends one produce request of nearly 100 MiB (the
// default max_request_size) at once, and reads its answer (the broker
// refuses the records; Ferry reads and forwards every byte either way).
func produce(addr string, clients int) {
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, 1, 30000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "mem"
	rp := kmsg.NewProduceRequestTopicPartition()
	rp.Records = make([]byte, 100<<20-4<<10)
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	b := frame(req, 1)
	run(addr, clients, func(c net.Conn) error {
		if _, err := c.Write(b); err != nil {
			return err
		}
		return readFrame(c)
	})
}

// fetch: each client pipelines n fetches of about 2 MiB each without
// reading, until Ferry's memory stops growing; then reads every answer.
func fetch(f *ferryProc, clients, n int) {
	req := kmsg.NewPtrFetchRequest()
	req.Version, req.ReplicaID, req.MaxWaitMillis, req.MinBytes, req.MaxBytes, req.SessionEpoch = 12, -1, 500, 1, 4<<20, -1
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic = "mem"
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.PartitionMaxBytes, rp.CurrentLeaderEpoch = 2<<20, -1
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	var sent sync.WaitGroup
	sent.Add(clients)
	release := make(chan struct{})
	go func() {
		sent.Wait()
		// Until the RSS has not grown for two seconds (at most 30s).
		last, still := f.rss(), time.Now()
		for deadline := time.Now().Add(30 * time.Second); time.Since(still) < 2*time.Second && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if r := f.rss(); r > last+1<<20 {
				last, still = r, time.Now()
			}
		}
		fmt.Printf("fetch    %d clients not reading: RSS %d MiB, ferry_buffered_bytes %s\n", clients, f.rss()>>20, f.buffered())
		close(release)
	}()
	run(f.addr, clients, func(c net.Conn) error {
		for i := range n {
			req.Topics[0].Partitions[0].FetchOffset = int64(i*3) % 200
			if _, err := c.Write(frame(req, int32(i))); err != nil {
				return err
			}
		}
		sent.Done()
		<-release
		for range n {
			if err := readFrame(c); err != nil {
				return err
			}
		}
		return nil
	})
}

// idle: each client asks ApiVersions and produces one small record, then
// stays connected doing nothing; measured once every client is idle (and
// Ferry has had a give-back period to take back their upstream connections).
func idle(f *ferryProc, clients int, base int64) {
	av := kmsg.NewPtrApiVersionsRequest()
	av.Version, av.ClientSoftwareName, av.ClientSoftwareVersion = 3, "memrss", "1"
	req := kmsg.NewPtrProduceRequest()
	req.Version, req.Acks, req.TimeoutMillis = 9, 1, 30000
	rt := kmsg.NewProduceRequestTopic()
	rt.Topic = "mem"
	rt.Partitions = append(rt.Partitions, kmsg.NewProduceRequestTopicPartition())
	req.Topics = append(req.Topics, rt)
	b := append(frame(av, 1), frame(req, 2)...)
	var ready sync.WaitGroup
	ready.Add(clients)
	release := make(chan struct{})
	go func() {
		ready.Wait()
		time.Sleep(3 * time.Second)
		rss := f.rss()
		fmt.Printf("idle     %d clients connected and idle: RSS %d MiB (+%.1f KiB a connection), ferry_upstream_connections %s\n",
			clients, rss>>20, float64(rss-base)/1024/float64(clients), f.upstreamConns())
		// Pooled upstream connections unused for a minute close.
		time.Sleep(65 * time.Second)
		rss = f.rss()
		fmt.Printf("idle     %d clients, 65 s later: RSS %d MiB (+%.1f KiB a connection), ferry_upstream_connections %s\n",
			clients, rss>>20, float64(rss-base)/1024/float64(clients), f.upstreamConns())
		close(release)
	}()
	run(f.addr, clients, func(c net.Conn) error {
		if _, err := c.Write(b); err != nil {
			return err
		}
		for range 2 {
			if err := readFrame(c); err != nil {
				return err
			}
		}
		ready.Done()
		<-release
		return nil
	})
}

// run runs f on one connection per client, all at once, then closes them.
func run(addr string, clients int, f func(net.Conn) error) {
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				fatal(err)
			}
			defer c.Close()
			c.SetDeadline(time.Now().Add(5 * time.Minute))
			if err := f(c); err != nil {
				fatal(err)
			}
		}()
	}
	wg.Wait()
}

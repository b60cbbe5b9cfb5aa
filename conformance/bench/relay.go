package main

// The relay: the cheapest hop there can be between a Kafka client and its
// brokers, bytes copied both ways with splice(2) and nothing parsed. It
// runs as this binary re-executed with relayEnv set, a process of its own
// like Ferry, so that the benchmark can tell what any extra hop costs on
// this machine from what Ferry's own work costs. Every broker has a
// listener "RELAY" advertised at a relay port, so a client bootstrapped at
// the relay reaches every broker through it.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/valyala/bytebufferpool"

	"github.com/ferry-gw/ferry/protocol"
)

const (
	// relayEnv holds "listen>target" pairs, comma separated; its presence
	// makes this binary run the relay instead of the benchmark.
	relayEnv = "FERRY_BENCH_RELAY"
	// relayCopyEnv, set to anything, makes the relay copy through a buffer
	// (-relay-copy).
	relayCopyEnv = "FERRY_BENCH_RELAY_COPY"
	// relayFramesEnv, set to anything, makes the relay read each Kafka
	// frame whole before it writes it (-relay-frames).
	relayFramesEnv = "FERRY_BENCH_RELAY_FRAMES"
	// relayListener is the brokers' listener that the relay forwards to.
	relayListener = "RELAY"
)

// runRelay is the relay process: it prints "ready <listen addresses>" once
// it listens and relays until SIGINT or SIGTERM.
func runRelay(spec string) error {
	var addrs []string
	for _, pair := range strings.Split(spec, ",") {
		from, to, ok := strings.Cut(pair, ">")
		if !ok {
			return fmt.Errorf("relay: %q is not listen>target", pair)
		}
		ln, err := net.Listen("tcp", from)
		if err != nil {
			return err
		}
		defer ln.Close()
		addrs = append(addrs, ln.Addr().String())
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go relay(c.(*net.TCPConn), to)
			}
		}()
	}
	fmt.Printf("ready %s\n", strings.Join(addrs, ","))
	sigc := make(chan os.Signal, 1)
	signal.Notify(sigc, syscall.SIGINT, syscall.SIGTERM)
	<-sigc
	return nil
}

// relay copies c to a new connection to target and back until both sides
// have finished. *net.TCPConn to *net.TCPConn is spliced by the net
// package, unless relayCopyEnv asks for a buffer.
func relay(c *net.TCPConn, target string) {
	defer c.Close()
	nc, err := net.Dial("tcp", target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench: relay:", err)
		return
	}
	u := nc.(*net.TCPConn)
	defer u.Close()
	done := make(chan struct{})
	go func() {
		relayCopy(u, c)
		u.CloseWrite()
		close(done)
	}()
	relayCopy(c, u)
	c.CloseWrite()
	<-done
}

// relayCopy copies src to dst: spliced, or with relayCopyEnv set through a
// 256 KiB buffer (wrapped, the connections hide the ReadFrom and WriteTo
// that would splice).
func relayCopy(dst, src *net.TCPConn) {
	if os.Getenv(relayFramesEnv) != "" {
		relayFrames(dst, src)
		return
	}
	if os.Getenv(relayCopyEnv) == "" {
		io.Copy(dst, src)
		return
	}
	io.CopyBuffer(struct{ io.Writer }{dst}, struct{ io.Reader }{src}, make([]byte, 256<<10))
}

// relayFrames copies src to dst a Kafka frame at a time: each frame read
// whole, as Ferry reads a client's request (its size through a 4 KiB
// buffered reader, protocol.ReadFrameSize and ReadFrameBody), then written
// with one writev, as a gateway that must see a whole request before it
// sends it does. Nothing in the frame is parsed. One buffer per direction,
// grown to the largest frame and reused.
func relayFrames(dst, src *net.TCPConn) {
	br := bufio.NewReaderSize(src, 4<<10)
	var size [4]byte
	buf := new(bytebufferpool.ByteBuffer)
	for {
		n, err := protocol.ReadFrameSize(br, math.MaxInt32)
		if err != nil {
			return
		}
		if err := protocol.ReadFrameBody(br, n, buf); err != nil {
			return
		}
		binary.BigEndian.PutUint32(size[:], uint32(n))
		bufs := net.Buffers{size[:], buf.B}
		if _, err := bufs.WriteTo(dst); err != nil {
			return
		}
	}
}

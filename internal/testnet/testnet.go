// Package testnet gives tests real sockets: both ends of a TCP connection
// over loopback, where a net.Pipe would not do (writev(2), kernel buffers,
// deadlines as a broker's socket has them).
package testnet

import (
	"net"
	"testing"
)

// Pair returns both ends of a TCP connection over loopback, closed when
// the test ends (closing them earlier is fine).
func Pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	if client, err = net.Dial("tcp", ln.Addr().String()); err != nil {
		t.Fatal(err)
	}
	if server = <-accepted; server == nil {
		client.Close()
		t.Fatal("accept failed")
	}
	t.Cleanup(func() {
		client.Close()
		server.Close()
	})
	return client, server
}

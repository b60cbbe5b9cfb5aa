package mirror

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"io"
	"testing"

	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/ferry-gw/ferry/internal/testnet"
)

// TestSendProduceFrame: a writer's produce sent with its records written
// from where they are (produceFrame) is, byte for byte, the frame kmsg
// encodes with them copied in, at every Produce version, with and without
// a transactional ID, for records on either side of writevFrom; and what
// the broker's end of the connection reads decodes to the same request.
func TestSendProduceFrame(t *testing.T) {
	txn := "ferry-mirror-orders-3"
	for v := int16(3); v <= (*kmsg.ProduceRequest)(nil).MaxVersion(); v++ {
		for _, size := range []int{writevFrom - 1, writevFrom, 1 << 20} {
			for _, txnID := range []*string{nil, &txn} {
				recs := make([]byte, size)
				for i := range recs {
					recs[i] = byte(i*7 + size)
				}
				req := kmsg.NewPtrProduceRequest()
				req.Version = v
				req.Acks = -1
				req.TimeoutMillis = 30000
				req.TransactionID = txnID
				tp := kmsg.NewProduceRequestTopic()
				tp.Topic = "orders"
				pp := kmsg.NewProduceRequestTopicPartition()
				pp.Partition = 3
				pp.Records = recs
				tp.Partitions = append(tp.Partitions, pp)
				req.Topics = append(req.Topics, tp)

				fmtr := kmsg.NewRequestFormatter(kmsg.FormatterClientID("ferry-mirror"))
				want := fmtr.AppendRequest(nil, req, 42)

				// TCP over loopback: net.Buffers are written with writev(2) there.
				client, broker := testnet.Pair(t)
				c := &conn{nc: client, br: bufio.NewReader(client), fmt: fmtr}
				got := make(chan []byte, 1)
				go func() {
					var size [4]byte
					if _, err := io.ReadFull(broker, size[:]); err != nil {
						got <- nil
						return
					}
					frame := make([]byte, 4+binary.BigEndian.Uint32(size[:]))
					copy(frame, size[:])
					if _, err := io.ReadFull(broker, frame[4:]); err != nil {
						got <- nil
						return
					}
					got <- frame
				}()
				// At writevFrom and over, the records are not copied.
				if _, ok := c.produceFrame(req, 1); ok != (size >= writevFrom) {
					t.Fatalf("v%d, %d bytes: written from where they are: %v, want %v", v, size, ok, size >= writevFrom)
				}
				c.corr = 41
				cl := c.Send(req)
				frame := <-got
				client.Close()
				broker.Close()
				if cl.done && cl.err != nil {
					t.Fatalf("v%d, %d bytes: Send: %v", v, size, cl.err)
				}
				if !bytes.Equal(frame, want) {
					t.Fatalf("v%d, %d bytes, txn %v: the frame sent (%d bytes) is not kmsg's encoding (%d bytes)", v, size, txnID != nil, len(frame), len(want))
				}
				if !bytes.Equal(pp.Records, recs) || &req.Topics[0].Partitions[0].Records[0] != &recs[0] {
					t.Fatalf("v%d: the request's records were not left as they were", v)
				}

				// Decoded as a broker would: the records at the offset are the records sent.
				dec := kmsg.NewPtrProduceRequest()
				dec.Version = v
				body := frame[4+2+2+4:] // key, version, correlation ID
				n := int(binary.BigEndian.Uint16(body))
				body = body[2+n:] // client ID
				if req.IsFlexible() {
					body = body[1:] // the header's tagged fields
				}
				if err := dec.ReadFrom(body); err != nil {
					t.Fatalf("v%d: decoding the frame sent: %v", v, err)
				}
				if len(dec.Topics) != 1 || len(dec.Topics[0].Partitions) != 1 || !bytes.Equal(dec.Topics[0].Partitions[0].Records, recs) || dec.Topics[0].Partitions[0].Partition != 3 {
					t.Fatalf("v%d, %d bytes: the decoded request's records differ from those sent", v, size)
				}
			}
		}
	}
}

// BenchmarkSendProduce: one writer's produce of a 1 MiB batch written to a
// broker's connection over loopback (the broker's end drained).
func BenchmarkSendProduce(b *testing.B) {
	client, broker := testnet.Pair(b)
	defer client.Close()
	defer broker.Close()
	go io.Copy(io.Discard, broker)
	c := &conn{nc: client, br: bufio.NewReader(client), fmt: kmsg.NewRequestFormatter(kmsg.FormatterClientID("ferry-mirror"))}
	req := kmsg.NewPtrProduceRequest()
	req.Version = produceVersion
	req.Acks = -1
	tp := kmsg.NewProduceRequestTopic()
	tp.Topic = "orders"
	pp := kmsg.NewProduceRequestTopicPartition()
	pp.Records = make([]byte, 1<<20)
	tp.Partitions = append(tp.Partitions, pp)
	req.Topics = append(req.Topics, tp)
	b.SetBytes(1 << 20)
	b.ReportAllocs()
	for b.Loop() {
		c.pending = c.pending[:0]
		if cl := c.Send(req); cl.err != nil {
			b.Fatal(cl.err)
		}
	}
}

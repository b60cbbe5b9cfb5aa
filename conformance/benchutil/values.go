package benchutil

import (
	"math/rand/v2"
	"strconv"
	"strings"
)

// words make record values look like application JSON, so that codecs
// have something to find, as in real traffic.
var words = strings.Fields(`order customer invoice shipment payment refund account
	status pending shipped delivered cancelled region eu-west us-east ap-south
	currency EUR USD GBP JPY amount quantity sku warehouse carrier priority
	standard express created updated source web mobile api partner channel`)

// Values returns n record values of size bytes, deterministic, without
// newlines (the mirror benchmark also writes them one a line into
// ProducerPerformance's payload file).
func Values(n, size int) [][]byte {
	rng := rand.New(rand.NewPCG(1, 2))
	out := make([][]byte, n)
	for i := range out {
		b := make([]byte, 0, size+64)
		b = append(b, `{"id":`...)
		b = strconv.AppendUint(b, rng.Uint64(), 10)
		for len(b) < size {
			b = append(b, `,"`...)
			b = append(b, words[rng.IntN(len(words))]...)
			b = append(b, `":"`...)
			if rng.IntN(2) == 0 {
				b = append(b, words[rng.IntN(len(words))]...)
			} else {
				b = strconv.AppendUint(b, rng.Uint64N(1_000_000), 16)
			}
			b = append(b, '"')
		}
		out[i] = b[:size]
	}
	return out
}

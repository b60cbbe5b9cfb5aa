package kafkatest

import "os"

// Variant is a Kafka version in one of its modes, as the version matrix
// runs it.
type Variant struct {
	Version   string
	ZooKeeper bool
}

// String names the variant, e.g. "3.9.1-kraft", "2.8.2-zk".
func (v Variant) String() string {
	if v.ZooKeeper {
		return v.Version + "-zk"
	}
	return v.Version + "-kraft"
}

// Options start a cluster of this variant.
func (v Variant) Options() []Option {
	opts := []Option{WithVersion(v.Version)}
	if v.ZooKeeper {
		opts = append(opts, WithZooKeeper())
	}
	return opts
}

// Matrix is every version of Versions in every mode the harness runs it
// in: 2.8 with ZooKeeper, 3.6 and 3.9 with KRaft and with ZooKeeper, 4.x
// with KRaft.
func Matrix() []Variant {
	var out []Variant
	for _, v := range Versions {
		if hasKRaft(v) {
			out = append(out, Variant{Version: v})
		}
		if hasZooKeeper(v) {
			out = append(out, Variant{Version: v, ZooKeeper: true})
		}
	}
	return out
}

// FullMatrix reports whether tests run the whole version matrix
// (FERRY_VERSIONS=all, as `make test-versions` sets it) rather than the
// slice `make test` runs.
func FullMatrix() bool { return os.Getenv("FERRY_VERSIONS") == "all" }

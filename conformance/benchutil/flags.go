package benchutil

import (
	"errors"
	"flag"
	"time"
)

// Load is how a benchmark that compares paths (bench, tlsbench) loads
// each: the length and number of its produce and consume runs and the
// shape of its topic. Its flags are the same in every such benchmark.
type Load struct {
	Duration   time.Duration // one produce run
	Warmup     time.Duration // the unmeasured produce run per path
	Records    int64         // records read by one consume run
	Rounds     int           // runs per path and phase
	Partitions int           // of the benchmark topic
	Size       int           // record value bytes
}

// LoadHelp is the help of the Load flags whose meaning a benchmark words
// its own way.
type LoadHelp struct {
	Duration, Warmup, Rounds string
}

// Flags defines l's flags on fs, with l's values as their defaults.
func (l *Load) Flags(fs *flag.FlagSet, help LoadHelp) {
	fs.DurationVar(&l.Duration, "duration", l.Duration, help.Duration)
	fs.DurationVar(&l.Warmup, "warmup", l.Warmup, help.Warmup)
	fs.Int64Var(&l.Records, "records", l.Records, "records read by one consume run (capped at what the produce runs wrote)")
	fs.IntVar(&l.Rounds, "rounds", l.Rounds, help.Rounds)
	fs.IntVar(&l.Partitions, "partitions", l.Partitions, "partitions of the benchmark topic (replication factor 3)")
	fs.IntVar(&l.Size, "size", l.Size, "record value size in bytes")
}

// Check reports a Load flag out of range.
func (l Load) Check() error {
	switch {
	case l.Duration <= 0 || l.Warmup < 0:
		return errors.New("-duration must be positive and -warmup not negative")
	case l.Records < 1 || l.Rounds < 1 || l.Partitions < 1 || l.Size < 1:
		return errors.New("-records, -rounds, -partitions and -size must be positive")
	}
	return nil
}

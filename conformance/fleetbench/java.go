package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/ferry-gw/ferry/conformance/benchutil"
	"github.com/ferry-gw/ferry/conformance/kafkatest"
)

//go:embed FleetProducer.java
var fleetProducerJava []byte

// recoverJava turns a benchutil.JavaTB's Fatalf into *err.
func recoverJava(err *error) { benchutil.RecoverJava(recover(), err) }

// compileJava compiles FleetProducer.java into dir/java and returns the
// class path that runs it.
func compileJava(dir string) (cp string, err error) {
	defer recoverJava(&err)
	tb := benchutil.NewJavaTB("javac", step)
	defer tb.Close()
	kcp := kafkatest.Classpath(tb)
	src := filepath.Join(dir, "FleetProducer.java")
	out := filepath.Join(dir, "java")
	if err := os.WriteFile(src, fleetProducerJava, 0o644); err != nil {
		return "", err
	}
	if b, err := exec.Command("javac", "-encoding", "UTF-8", "-cp", kcp, "-d", out, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("javac: %v\n%s", err, b)
	}
	return out + string(os.PathListSeparator) + kcp, nil
}

// javaLine is one line FleetProducer prints.
type javaLine struct {
	Sent    *int             `json:"sent"`
	Ack     *int             `json:"ack"`
	At      int64            `json:"at"`
	Part    int32            `json:"partition"`
	Error   string           `json:"error"`
	Leaders map[string]int32 `json:"leaders"`
}

// startJava runs FleetProducer through the fleet with the producer
// settings given (key=value; none: kafka-clients' defaults). Its records
// go to p.rs as it reports them; stop closes its standard input (it
// flushes and exits) and waits.
func (b *bench) startJava(ctx context.Context, topic string, settings []string) (_ *producer, _ func(), err error) {
	defer recoverJava(&err)
	tb := benchutil.NewJavaTB("java producer", step)
	args := append([]string{"-cp", b.javaCP, "FleetProducer", strings.Join(b.fleet.bootstrap(), ","), topic,
		strconv.FormatInt(b.o.interval.Milliseconds(), 10), "java"}, settings...)
	cmd := kafkatest.JavaCmd(ctx, tb, "-Xmx256m", args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Close()
		return nil, nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Close()
		return nil, nil, err
	}
	logf, err := os.OpenFile(filepath.Join(os.TempDir(), "fleetbench-java.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		tb.Close()
		return nil, nil, err
	}
	cmd.Stderr = logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		tb.Close()
		return nil, nil, err
	}
	p := &producer{name: "java", leaderMap: map[int32]int32{}}
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		bySeq := map[int]*sent{}
		for sc.Scan() {
			var l javaLine
			if json.Unmarshal(sc.Bytes(), &l) != nil {
				continue
			}
			p.mu.Lock()
			switch {
			case l.Leaders != nil:
				for k, v := range l.Leaders {
					if part, err := strconv.Atoi(k); err == nil {
						p.leaderMap[int32(part)] = v
					}
				}
			case l.Sent != nil:
				s := &sent{at: time.UnixMilli(l.At), partition: -1}
				bySeq[*l.Sent] = s
				p.rs = append(p.rs, s)
			case l.Ack != nil:
				if s := bySeq[*l.Ack]; s != nil {
					s.acked, s.partition = time.UnixMilli(l.At), l.Part
					if l.Error != "" {
						s.err = fmt.Errorf("%s", l.Error)
					}
					delete(bySeq, *l.Ack)
				}
			}
			p.mu.Unlock()
		}
		io.Copy(io.Discard, stdout)
	}()
	stop := func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { <-read; cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
			<-done
		}
		logf.Close()
		tb.Close()
	}
	return p, stop, nil
}

package splice

import (
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"syscall"

	"golang.org/x/sys/unix"
)

// Size is the capacity asked for each pipe, which the kernel counts in
// page-sized slots (256 here): a slot holds a fragment of a socket's
// buffer, up to 32 KiB from a loopback peer, less from a network card, so
// what fits in bytes depends on how the bytes arrived. An unprivileged
// process gets pipes of up to /proc/sys/fs/pipe-max-size (1 MiB by
// default), and one whose pipes hold pipe-user-pages-soft smaller ones.
const Size = 1 << 20

// poolSize bounds the idle pipes kept (each holds two descriptors and its
// capacity against the user's pipe pages).
const poolSize = 32

// MaxInUse bounds the pipes out at once: each holds two descriptors, and
// a member with thousands of producers held by a switch must not spend
// the descriptors its connections need. Past it Get fails and the caller
// copies.
const MaxInUse = 512

var (
	pool  = make(chan *Pipe, poolSize)
	inUse atomic.Int64
)

// ErrBusy is Get's error when MaxInUse pipes are out.
var ErrBusy = errors.New("splice: every pipe is in use")

// Pipe is a kernel pipe. It is not safe for concurrent use.
type Pipe struct {
	r, w int
	held int // bytes moved in and not yet out
}

// Get returns an empty pipe, from the pool or new.
func Get() (*Pipe, error) {
	if inUse.Add(1) > MaxInUse {
		inUse.Add(-1)
		return nil, ErrBusy
	}
	select {
	case p := <-pool:
		return p, nil
	default:
	}
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		inUse.Add(-1)
		return nil, fmt.Errorf("pipe2: %w", err)
	}
	p := &Pipe{r: fds[0], w: fds[1]}
	// Refused over the user's pipe pages: the default (16 slots) stays,
	// and From stops sooner.
	unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, Size)
	return p, nil
}

// Put gives p back for reuse: an empty pipe goes to the pool (or is
// closed when it is full); one still holding bytes is closed.
func Put(p *Pipe) {
	if p == nil {
		return
	}
	inUse.Add(-1)
	if p.held != 0 {
		p.Close()
		return
	}
	select {
	case pool <- p:
	default:
		p.Close()
	}
}

// Held is how many bytes were moved in and not yet out.
func (p *Pipe) Held() int { return p.held }

// Close closes the pipe, dropping what it holds. Closing it again does
// nothing.
func (p *Pipe) Close() {
	if p.r < 0 {
		return
	}
	unix.Close(p.r)
	unix.Close(p.w)
	p.r, p.w, p.held = -1, -1, 0
}

// From moves up to n bytes from the socket behind rc into the pipe,
// waiting (under the socket's read deadline) for them to arrive. It
// returns fewer than n, and no error, when the pipe is full: the rest is
// still on the socket. io.ErrUnexpectedEOF: the peer closed first.
func (p *Pipe) From(rc syscall.RawConn, n int) (int, error) {
	moved := 0
	var err error
	rerr := rc.Read(func(fd uintptr) bool {
		again := false
		for moved < n {
			m, e := unix.Splice(int(fd), nil, p.w, nil, n-moved, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				// Nothing to read, or no room in the pipe: bytes
				// waiting on the socket say which (once they were
				// there before a second try: they may have come
				// just after the first).
				if q, qerr := unix.IoctlGetInt(int(fd), unix.SIOCINQ); qerr == nil && q > 0 {
					if again {
						return true
					}
					again = true
					continue
				}
				return false // wait for the socket
			case e != nil:
				err = e
				return true
			case m == 0:
				err = io.ErrUnexpectedEOF
				return true
			}
			moved += int(m)
			p.held += int(m)
		}
		return true
	})
	if err == nil {
		err = rerr
	}
	return moved, err
}

// To moves n bytes held by the pipe to the socket behind rc, waiting
// (under the socket's write deadline) for room.
func (p *Pipe) To(rc syscall.RawConn, n int) (int, error) {
	if n > p.held {
		return 0, fmt.Errorf("splice: %d bytes asked of a pipe holding %d", n, p.held)
	}
	moved := 0
	var err error
	werr := rc.Write(func(fd uintptr) bool {
		for moved < n {
			m, e := unix.Splice(p.r, nil, int(fd), nil, n-moved, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			switch {
			case e == unix.EINTR:
				continue
			case e == unix.EAGAIN:
				return false // the socket's buffer is full (the pipe holds n)
			case e != nil:
				err = e
				return true
			case m == 0:
				err = io.ErrShortWrite
				return true
			}
			moved += int(m)
			p.held -= int(m)
		}
		return true
	})
	if err == nil {
		err = werr
	}
	return moved, err
}

// ReadFull reads len(b) bytes held by the pipe into b (the way back into
// the process, for a request that must be read after all).
func (p *Pipe) ReadFull(b []byte) error {
	if len(b) > p.held {
		return fmt.Errorf("splice: %d bytes asked of a pipe holding %d", len(b), p.held)
	}
	for len(b) > 0 {
		m, err := unix.Read(p.r, b)
		switch {
		case err == unix.EINTR:
			continue
		case err != nil:
			// The pipe holds them: EAGAIN cannot be.
			return fmt.Errorf("splice: reading a pipe: %w", err)
		case m == 0:
			return io.ErrUnexpectedEOF
		}
		b = b[m:]
		p.held -= m
	}
	return nil
}

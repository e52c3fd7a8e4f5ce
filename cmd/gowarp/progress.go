package main

import (
	"fmt"
	"io"
	"sync"
	"time"

	"golang.org/x/term"
)

// Progress goes to a terminal only, once a command has run this long: a
// short run shows nothing extra.
var (
	progressDelay = 2 * time.Second
	progressTick  = 250 * time.Millisecond
)

// isTerminal reports whether w is a terminal (a pipe, a file or a buffer
// is not).
func isTerminal(w io.Writer) bool {
	f, ok := w.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(f.Fd()))
}

// progress keeps one status line at the bottom of a terminal: which run of
// how many, its test and size, how long it has gone and how long the rest
// should take. Output written through print clears the line first, so
// results and the status line share a screen. A nil *progress does
// nothing but print.
type progress struct {
	w io.Writer

	mu       sync.Mutex
	total    int
	start    time.Time
	run      int // 1-based index of the run going on
	what     string
	runStart time.Time
	shown    bool // the status line is on the screen
	stop     chan struct{}
	done     chan struct{}
	closed   sync.Once
}

// newProgress returns a progress line on w, or nil where w is not a
// terminal or quiet is set.
func newProgress(w io.Writer, quiet bool) *progress {
	if quiet || !isTerminal(w) {
		return nil
	}
	p := &progress{w: w, start: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go p.tick()
	return p
}

// setTotal says how many runs there are.
func (p *progress) setTotal(n int) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.total = n
}

// writer returns a writer to w that moves the status line out of the
// way of what it writes (w itself if p is nil).
func (p *progress) writer(w io.Writer) io.Writer {
	if p == nil {
		return w
	}
	return writerFunc(func(b []byte) (n int, err error) {
		p.print(func() { n, err = w.Write(b) })
		return n, err
	})
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (p *progress) tick() {
	defer close(p.done)
	t := time.NewTicker(progressTick)
	defer t.Stop()
	for {
		select {
		case <-p.stop:
			return
		case <-t.C:
			p.mu.Lock()
			p.draw()
			p.mu.Unlock()
		}
	}
}

// begin says run i (1-based) has started, and what it is.
func (p *progress) begin(i int, what string) {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run, p.what, p.runStart = i, what, time.Now()
	p.draw()
}

// draw writes the status line over the last one; p.mu is held.
func (p *progress) draw() {
	now := time.Now()
	elapsed := now.Sub(p.start)
	if p.run == 0 || elapsed < progressDelay {
		return
	}
	left := "?"
	if done := p.run - 1; done > 0 {
		// The runs done so far, on average, for the ones still to go.
		est := elapsed/time.Duration(done)*time.Duration(p.total-done) - now.Sub(p.runStart)
		left = "~" + max(est, 0).Round(time.Second).String()
	}
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s  (%.1fs in; %s elapsed, %s left)",
		p.run, p.total, p.what, now.Sub(p.runStart).Seconds(), elapsed.Round(time.Second), left)
	p.shown = true
}

func (p *progress) clear() {
	if p.shown {
		fmt.Fprint(p.w, "\r\033[K")
		p.shown = false
	}
}

// print runs write (which prints to the terminal) with the status line
// out of the way; it comes back at the next tick.
func (p *progress) print(write func()) {
	if p == nil {
		write()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	write()
}

// close removes the status line for good; it may be called again.
func (p *progress) close() {
	if p == nil {
		return
	}
	p.closed.Do(func() {
		close(p.stop)
		<-p.done
		p.mu.Lock()
		defer p.mu.Unlock()
		p.clear()
	})
}

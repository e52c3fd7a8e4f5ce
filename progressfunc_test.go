package gowarp_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gowarp/gowarp"
)

// TestProgressFuncSends: a Send/Receive ping-pong in which both sides
// post from QP.ProgressFunc, over TCP and over shared memory: every
// message arrives in turn and both loops end; then a loop whose peer
// closes ends with an error the root package matches, not a hang.
func TestProgressFuncSends(t *testing.T) {
	for _, o := range []gowarp.ConnectOptions{{}, {SharedMemory: true}} {
		t.Run(fmt.Sprintf("shm=%v", o.SharedMemory), func(t *testing.T) {
			p := newPair(t, o)
			const rounds = 300
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			// Each side's receive is posted before either Sends.
			type side struct {
				mr  *gowarp.MR
				buf []byte
			}
			var sides [2]side
			for i, qp := range []*gowarp.QP{p.a, p.b} {
				sides[i].mr, sides[i].buf = p.reg(t, 16, gowarp.LocalWrite)
				if err := qp.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: sides[i].mr, Offset: 8, Length: 8}}}); err != nil {
					t.Fatal(err)
				}
			}
			play := func(qp *gowarp.QP, cq *gowarp.CQ, first bool) error {
				s := sides[1]
				if first {
					s = sides[0]
				}
				mr, buf := s.mr, s.buf
				recv := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: mr, Offset: 8, Length: 8}}}
				send := gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: mr, Length: 8}}}
				got, sent := 0, 0
				var ferr error
				post := func() bool {
					buf[0] = byte(sent)
					if ferr = qp.PostSend(&send); ferr == nil {
						sent++
					}
					return ferr == nil
				}
				var wc [4]gowarp.Completion
				started := false
				err := qp.ProgressFunc(ctx, func() bool {
					if !started {
						started = true
						if first && !post() {
							return false
						}
					}
					for n := cq.Poll(wc[:]); n > 0; n = cq.Poll(wc[:]) {
						for _, c := range wc[:n] {
							if ferr = c.Err(); ferr != nil {
								return false
							}
							if c.Op != gowarp.CompRecv {
								continue
							}
							if buf[8] != byte(got) {
								ferr = fmt.Errorf("message %d: got %d", got, buf[8])
								return false
							}
							got++
							if ferr = qp.PostRecv(&recv); ferr != nil {
								return false
							}
							if first && got == rounds {
								return false
							}
							if !post() {
								return false
							}
							if !first && sent == rounds {
								return false
							}
						}
					}
					return true
				})
				if ferr != nil {
					return ferr
				}
				return err
			}
			errc := make(chan error, 1)
			go func() { errc <- play(p.b, p.bcq, false) }()
			if err := play(p.a, p.acq, true); err != nil {
				t.Fatal(err)
			}
			if err := <-errc; err != nil {
				t.Fatal(err)
			}

			// The peer goes while a loop waits.
			go func() { errc <- p.a.ProgressFunc(context.Background(), func() bool { return true }) }()
			time.Sleep(20 * time.Millisecond)
			go p.b.Close() // if it hangs, so does ProgressFunc: the select says so
			select {
			case err := <-errc:
				if err == nil || !matchable(err) {
					t.Fatalf("the peer closed: ProgressFunc returned %v", err)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("the peer closed, and ProgressFunc went on waiting")
			}
		})
	}
}

// TestProgressFuncContext: a loop whose context ends returns its error.
func TestProgressFuncContext(t *testing.T) {
	p := newPair(t, gowarp.ConnectOptions{})
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- p.a.ProgressFunc(ctx, func() bool { return true }) }()
	time.Sleep(20 * time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("ProgressFunc after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("cancel did not end ProgressFunc")
	}
}

// TestProgressFuncCloses: the function may close its own queue pair
// (Close, Disconnect), which waits for the receive path the function
// holds: ProgressFunc finishes the close as it returns, with ErrClosed.
// Another goroutine's Close ends a waiting loop too.
func TestProgressFuncCloses(t *testing.T) {
	for _, o := range []gowarp.ConnectOptions{{}, {SharedMemory: true}} {
		for _, how := range []string{"close", "disconnect", "other"} {
			t.Run(fmt.Sprintf("shm=%v/%s", o.SharedMemory, how), func(t *testing.T) {
				p := newPair(t, o)
				dst, _ := p.reg(t, 8, gowarp.LocalWrite|gowarp.RemoteWrite)
				src, _ := p.reg(t, 8, gowarp.LocalWrite)
				errc := make(chan error, 1)
				go func() {
					errc <- p.a.ProgressFunc(context.Background(), func() bool {
						if dst.Placed() > 0 {
							switch how {
							case "close":
								p.a.Close()
							case "disconnect":
								p.a.Disconnect(context.Background())
							}
						}
						return true
					})
				}()
				time.Sleep(20 * time.Millisecond)
				if how == "other" {
					go p.a.Close() // if it hangs, so does ProgressFunc: the select says so
				} else if err := p.b.PostSend(&gowarp.SendWR{Op: gowarp.OpWrite, SGL: []gowarp.SGE{{MR: src, Length: 8}}, RemoteAddr: dst.Addr(), RKey: dst.STag()}); err != nil {
					t.Fatal(err)
				}
				select {
				case err := <-errc:
					if !errors.Is(err, gowarp.ErrClosed) {
						t.Fatalf("ProgressFunc: %v, want ErrClosed", err)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("closed, and ProgressFunc went on waiting")
				}
				if p.a.State() != gowarp.StateError {
					t.Fatalf("state %v after the close", p.a.State())
				}
			})
		}
	}
}

// TestProgressFuncOwnCompletions: a loop that posts signaled Writes and
// waits for their completions, which no FPDU from the peer answers (the
// peer only takes them), ends: the function is called again for the
// completions that came from the transmit path, in Handed mode (the
// posting goroutine completes them as the socket takes the bytes, while
// the function runs) and Acked mode (the transmit path's clock does,
// later). The AsyncOnly queue pairs complete from the transmit goroutine.
func TestProgressFuncOwnCompletions(t *testing.T) {
	for _, m := range []gowarp.CompletionMode{gowarp.Handed, gowarp.Acked} {
		for _, o := range []gowarp.ConnectOptions{{}, {SharedMemory: true}} {
			t.Run(fmt.Sprintf("mode=%d/shm=%v", m, o.SharedMemory), func(t *testing.T) {
				p := newIdlePairMode(t, 64, m, false)
				t.Cleanup(func() { closeBounded(t, p.a, p.b) })
				p.connectOn(t, o, o, "127.0.0.1:0", nil, nil)
				dst, _ := p.reg(t, 64, gowarp.LocalWrite|gowarp.RemoteWrite)
				src, _ := p.reg(t, 64, gowarp.LocalWrite)
				wr := gowarp.SendWR{Op: gowarp.OpWrite, Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: src, Length: 64}},
					RemoteAddr: dst.Addr(), RKey: dst.STag()}
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				const writes = 200
				posted, done, calls := 0, 0, 0
				var ferr error
				var wc [4]gowarp.Completion
				err := p.b.ProgressFunc(ctx, func() bool {
					calls++
					for n := p.bcq.Poll(wc[:]); n > 0; n = p.bcq.Poll(wc[:]) {
						for _, c := range wc[:n] {
							if ferr = c.Err(); ferr != nil {
								return false
							}
							done++
						}
					}
					if done == writes {
						return false
					}
					if posted == done {
						wr.ID = uint64(posted)
						if ferr = p.b.PostSend(&wr); ferr != nil {
							return false
						}
						posted++
					}
					return true
				})
				if ferr != nil {
					t.Fatal(ferr)
				}
				if err != nil {
					t.Fatalf("ProgressFunc after %d of %d completions (%d calls): %v", done, writes, calls, err)
				}
				// Handed: the socket or ring took them; they land soon.
				if err := dst.WaitPlaced(ctx, writes*64); err != nil {
					t.Fatalf("placed %d bytes, want %d: %v", dst.Placed(), writes*64, err)
				}
			})
		}
	}
}

// TestProgressFuncHoldsThePath: the function runs holding the receive
// path, even when the receive goroutine took what it answers: an echo
// server with one receive, which answers and only then, after some work,
// reposts it, never meets the client's next message without a receive.
// The client's first message comes before the server's loop starts, so
// the receive goroutine takes it; before the fix the function's first
// call ran beside that goroutine, which took the next message during the
// work: "Send with no receive", a Terminate.
func TestProgressFuncHoldsThePath(t *testing.T) {
	for _, o := range []gowarp.ConnectOptions{{}, {SharedMemory: true}} {
		t.Run(fmt.Sprintf("shm=%v", o.SharedMemory), func(t *testing.T) {
			p := newPair(t, o)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			smr, _ := p.reg(t, 64, gowarp.LocalWrite)
			cmr, cbuf := p.reg(t, 128, gowarp.LocalWrite)
			recv := gowarp.RecvWR{SGL: []gowarp.SGE{{MR: smr, Length: 64}}}
			if err := p.b.PostRecv(&recv); err != nil {
				t.Fatal(err)
			}
			const msgs = 5
			for range msgs {
				if err := p.a.PostRecv(&gowarp.RecvWR{SGL: []gowarp.SGE{{MR: cmr, Offset: 64, Length: 64}}}); err != nil {
					t.Fatal(err)
				}
			}
			// The client: each message as soon as the last echo is back.
			errc := make(chan error, 1)
			go func() {
				var wc [4]gowarp.Completion
				for i := range msgs {
					cbuf[0] = byte(i)
					if err := p.a.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: cmr, Length: 8}}}); err != nil {
						errc <- err
						return
					}
					for got := false; !got; {
						if err := p.acq.Wait(ctx); err != nil {
							errc <- fmt.Errorf("echo %d: %w (%v)", i, err, p.a.Err())
							return
						}
						for _, c := range wc[:p.acq.Poll(wc[:])] {
							if err := c.Err(); err != nil {
								errc <- fmt.Errorf("echo %d: %w (%v)", i, err, p.a.Err())
								return
							}
							got = got || c.Op == gowarp.CompRecv
						}
					}
				}
				errc <- nil
			}()
			time.Sleep(20 * time.Millisecond) // the first message is in
			var wc [4]gowarp.Completion
			echoed := 0
			var ferr error
			err := p.b.ProgressFunc(ctx, func() bool {
				for _, c := range wc[:p.bcq.Poll(wc[:])] {
					if ferr = c.Err(); ferr != nil {
						return false
					}
					if ferr = p.b.PostSend(&gowarp.SendWR{Op: gowarp.OpSend, SGL: []gowarp.SGE{{MR: smr, Length: c.Bytes}}}); ferr != nil {
						return false
					}
					time.Sleep(5 * time.Millisecond) // the answer's work, before the repost
					if ferr = p.b.PostRecv(&recv); ferr != nil {
						return false
					}
					echoed++
				}
				return echoed < msgs
			})
			if ferr == nil {
				ferr = err
			}
			if ferr != nil {
				t.Fatalf("server after %d echoes: %v (%v)", echoed, ferr, p.b.Err())
			}
			if err := <-errc; err != nil {
				t.Fatalf("client: %v", err)
			}
		})
	}
}

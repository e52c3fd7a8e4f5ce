package perftest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gowarp/gowarp"
)

// wordBytes is the memory of words as bytes, for registering it.
func wordBytes(w []uint32) []byte { return unsafe.Slice((*byte)(unsafe.Pointer(&w[0])), 4*len(w)) }

// waitCounts pumps the CQ until at least sends and recvs completions
// were seen.
func (d *data) waitCounts(ctx context.Context, sends, recvs int) error {
	for d.sends < sends || d.recvs < recvs {
		if _, err := d.pump(ctx, true); err != nil {
			return err
		}
	}
	return nil
}

// pingPong runs a latency test: Iters messages each way (write_lat,
// send_lat) or Iters Reads (read_lat, client), one in flight, and returns
// when each was posted. The order is perftest's: in write_lat the server
// Writes first, in send_lat the client Sends first, and each side then
// answers what it received. A Write's arrival is told by the bytes placed
// in the buffer (perftest polls the buffer's last byte, which carries the
// message's number; the number is checked here too). Unlike perftest,
// which busy-polls, the loop posts from QP.ProgressFunc: it answers where
// the bytes are read and sleeps between messages without a wake-up.
//
// A run of a Duration goes on until it ends, whatever the count, and
// returns instead how many messages it posted in its sampled window; each
// side stops at its own end, so a side left waiting for a message that
// will not come stops there too.
func (d *data) pingPong(ctx context.Context, o *Options, server bool, peer *Dest) (tposted []int64, sampled int, err error) {
	n, size := o.Iters, o.Size
	timed := o.Duration > 0
	from, to, end := o.window()
	if timed {
		n = math.MaxInt
	}
	out := d.buf.Bytes()[:size]
	in := d.buf.Bytes()[d.half : d.half+size]
	wr := gowarp.SendWR{Flags: gowarp.Signaled, SGL: []gowarp.SGE{{MR: d.buf, Length: size}},
		RemoteAddr: peer.VAddr, RKey: gowarp.STag(peer.RKey)}
	first := !server // who posts before receiving
	switch o.Test {
	case WriteLat:
		wr.Op = gowarp.OpWrite
		first = server
	case SendLat:
		wr.Op = gowarp.OpSend
	case ReadLat:
		wr.Op = gowarp.OpRead
	}
	if !timed {
		tposted = make([]int64, n)
	}
	t0 := time.Now()
	// Only the peer places bytes in this region, and its first Write may
	// land before this side is here: count from what its Writes of the
	// sizes before (perftest's -a) placed.
	placed0 := d.placed
	if !timed {
		d.placed += uint64(n) * uint64(size)
	}
	recvs0 := d.recvs
	scnt, rcnt, want := 0, 0, 0
	// Each round takes the next message, if one is to come, then posts
	// the next and waits for its completion, as perftest's loop does.
	const (
		begin = iota
		awaitRecv
		post
		awaitSend
	)
	phase := begin
	var ferr error
	step := func() bool {
		for {
			k, err := d.pump(ctx, false)
			if err != nil {
				ferr = err
				return false
			}
			if k == 0 {
				break
			}
		}
		for {
			switch phase {
			case begin:
				if scnt >= n && (o.Test == ReadLat || rcnt >= n) {
					return false
				}
				phase = post
				if o.Test != ReadLat && rcnt < n && !(scnt == 0 && first) {
					rcnt++
					phase = awaitRecv
				}
			case awaitRecv:
				switch o.Test {
				case WriteLat:
					// The placed count says the whole message is there.
					if d.buf.Placed() < placed0+uint64(rcnt)*uint64(size) {
						return true
					}
					if got := in[size-1]; got != byte(rcnt) {
						ferr = fmt.Errorf("the peer's Write %d ends with %d, want %d", rcnt, got, byte(rcnt))
						return false
					}
				case SendLat:
					if d.recvs < recvs0+rcnt {
						return true
					}
					// RxDepth receives were posted first; one more for
					// each taken while more Sends are to come than are
					// posted.
					if timed || rcnt+o.RxDepth <= n {
						if ferr = d.qp.PostRecv(d.recvWR()); ferr != nil {
							return false
						}
					}
				}
				phase = post
			case post:
				phase = begin
				if timed {
					t := int64(time.Since(t0))
					if t >= end {
						return false
					}
					if t >= from && t < to {
						sampled++
					}
				}
				if scnt < n {
					out[size-1] = byte(scnt + 1)
					if !timed {
						tposted[scnt] = int64(time.Since(t0))
					}
					scnt++
					wr.ID = uint64(scnt)
					want = d.sends + 1
					if err := d.qp.PostSend(&wr); err != nil {
						ferr = fmt.Errorf("posting message %d: %w", scnt, err)
						return false
					}
					phase = awaitSend
				}
			case awaitSend:
				if d.sends < want {
					return true
				}
				phase = begin
			}
		}
	}
	pctx := ctx
	if timed {
		var cancel context.CancelFunc
		pctx, cancel = context.WithDeadline(ctx, t0.Add(time.Duration(end)))
		defer cancel()
	}
	err = d.qp.ProgressFunc(pctx, step)
	if timed && (err != nil || ferr != nil) && ctx.Err() == nil {
		// The end, met waiting; or the peer's end, which closed
		// write_lat's connection (it has no closing handshake) while
		// this side's deadline was still to fire: the sides start within
		// a control message of each other, and a timer fires late on busy
		// CPUs. A peer gone earlier than the last quarter of the run is
		// an error, and so is any other.
		gone := d.qp.State() != gowarp.StateReady && time.Since(t0) >= time.Duration(end)*3/4
		if pctx.Err() != nil && ferr == nil || gone {
			err, ferr = nil, nil
		}
	}
	if ferr != nil {
		return nil, 0, ferr
	}
	if err != nil {
		switch phase {
		case awaitRecv:
			return nil, 0, fmt.Errorf("waiting for message %d: %w", rcnt, err)
		case awaitSend:
			return nil, 0, fmt.Errorf("message %d: %w", scnt, err)
		}
		return nil, 0, err
	}
	return tposted, sampled, nil
}

// sendBWServer is the send_bw server's traffic: it takes Iters Sends,
// reposting a receive for each while more are to come, and grants credits
// as perftest's server does on iWARP: every RxDepth/3 receives it
// RDMA-Writes the count of receives so far (a little-endian u32) to the
// client's credit buffer, after reposting, so that a client that keeps
// its Sends within RxDepth of its credit always finds a receive.
//
// A run of a Duration (perftest's -D) goes on, reposting every receive,
// until the Duration has passed since the first Send arrived, and counts
// the Sends that arrive between its margins, as perftest's server (its
// clock starts on the first receive, set_on_first_rx_packet). The client,
// whose clock started before, has stopped by then, and what it sent last
// finds receives: it keeps within RxDepth of the last credit.
func (d *data) sendBWServer(ctx context.Context, o *Options, client *Dest, rep *Report) error {
	n := o.Iters
	timed := o.Duration != 0
	sampleFrom, sampleTo, end := o.window()
	sampled := 0
	creditEvery := creditEvery(o)
	// One slot per credit Write in flight: a slot is not rewritten
	// while the Write that carries it may still be read.
	slots := make([]uint32, o.TxDepth)
	smr, err := d.pd.Register(wordBytes(slots), 0)
	if err != nil {
		return err
	}
	// deadline: a run of a Duration's end, once the first Send is in.
	var first, last, deadline time.Time
	writes := 0
	recvs0, sends0 := d.recvs, d.sends
	for got := 0; timed || got < n; {
		if err := d.pumpUntil(ctx, deadline); err != nil {
			if errors.Is(err, errRunOver) {
				break
			}
			return fmt.Errorf("after %d Sends: %w", got, err)
		}
		for ; got < d.recvs-recvs0; got++ {
			rc := got + 1
			last = time.Now()
			if rc == 1 {
				first = last
				if timed {
					deadline = first.Add(time.Duration(end))
				}
			}
			if t := int64(last.Sub(first)); timed && t >= sampleFrom && t < sampleTo {
				sampled++
			}
			if timed || rc+o.RxDepth <= n {
				if err := d.qp.PostRecv(d.recvWR()); err != nil {
					return err
				}
			}
			if rc%creditEvery != 0 {
				continue
			}
			for writes-(d.sends-sends0) >= len(slots) {
				if _, err := d.pump(ctx, true); err != nil {
					return err
				}
			}
			i := writes % len(slots)
			binary.LittleEndian.PutUint32(wordBytes(slots[i:i+1]), uint32(rc))
			if err := d.qp.PostSend(&gowarp.SendWR{ID: uint64(rc), Op: gowarp.OpWrite, Flags: gowarp.Signaled,
				SGL:        []gowarp.SGE{{MR: smr, Offset: 4 * i, Length: 4}},
				RemoteAddr: client.VAddr, RKey: gowarp.STag(client.RKey)}); err != nil {
				return fmt.Errorf("credit Write: %w", err)
			}
			writes++
		}
	}
	// The last credit Writes complete before the closing handshake.
	if err := d.waitCounts(ctx, sends0+writes, 0); err != nil {
		return err
	}
	if timed {
		*rep = reportSampled(o.Size, sampled, time.Duration(sampleTo-sampleFrom), o.unit())
		return nil
	}
	*rep = reportRecv(o.Size, n, first, last, o.unit())
	return nil
}

// errRunOver is pumpUntil's: the run's time is up.
var errRunOver = errors.New("perftest: the run's time is up")

// pumpUntil is pump, waiting for completions no later than end (ever if
// end is zero), when it returns errRunOver (at once if end has passed).
func (d *data) pumpUntil(ctx context.Context, end time.Time) error {
	if end.IsZero() {
		_, err := d.pump(ctx, true)
		return err
	}
	if !time.Now().Before(end) {
		return errRunOver
	}
	wctx, cancel := context.WithDeadline(ctx, end)
	defer cancel()
	_, err := d.pump(wctx, true)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil {
		return errRunOver
	}
	return err
}

// creditEvery is how many receives a send_bw server takes between credit
// Writes: a third of its receive depth, as perftest's credit_cnt.
func creditEvery(o *Options) int { return max(1, o.RxDepth/3) }

// creditsOver ends a send_bw client's size of a run over all sizes: the
// server counts its receives from zero again for the next size, so the
// client's credit word starts again at zero, as perftest's client sets it.
// It is cleared once the last size's credit Writes have landed (the
// region's placed count says so), so that none lands after: the server
// Writes one every creditEvery receives. A server that Writes fewer (other
// receive depths) is given a moment, and the word is cleared anyway.
// It returns how many of the last size's credit Writes landed, and how
// many were awaited.
func (d *data) creditsOver(ctx context.Context, o *Options) (landed, want int) {
	want = o.Iters / creditEvery(o)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	d.credit.WaitPlaced(wctx, uint64(4*(d.credited+want)))
	d.words[1] = 0
	// Counted from what landed, so that a size short of its Writes does
	// not make every later one wait for them.
	now := int(d.credit.Placed() / 4)
	landed, d.credited = now-d.credited, now
	return landed, want
}

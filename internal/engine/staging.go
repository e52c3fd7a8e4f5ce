package engine

// The receive staging buffer (rxStaging bytes: headers, trailers and small
// payloads land in it) is taken from stagingFree while bytes are pending
// and given back when the queue pair waits for its peer with nothing
// staged: the link's ReadIdle gives it back as the read that finds the
// socket empty parks, and takes one when bytes come (see receive).
// Thousands of queue pairs that wait hold none; one that streams keeps
// its own.

// stagingFree keeps as many buffers as were held at once, up to 1024
// (64 MiB), less what garbage collections find unused (see freeList). A
// queue pair holds its own from the read that wakes it until it waits
// again with nothing staged, and with several operations in flight it
// often has part of the next FPDU staged: with 256 such queue pairs on
// two cores (BenchmarkManyQPs N=256) more than 32 held one at once, and a
// list of 32 dropped and made 64 KiB buffers at ~500 bytes per operation.
var stagingFree = newFreeList(1024, func() *[rxStaging]byte { return new([rxStaging]byte) })

// rxMini is the queue pair's own small staging buffer (rxState.mini),
// taken instead of a whole one for a wait when the last read after one
// brought at most half of it: in a ping-pong of small messages the free
// list's get and put around each wait cost about 0.05 µs a round trip,
// most of it cache misses after the system calls in between. A read that
// leaves part of an FPDU in it moves that part to a whole buffer (see
// next); a large payload is read in place, the small buffer taking its
// trailer. Beside the cost of the two calls it saves, a wait it does not
// fit costs a read of a few hundred bytes before the rest, once: the
// next wait takes a whole buffer.
const rxMini = 256

// getStaging takes a staging buffer as r's and returns it.
func (r *rxState) getStaging() []byte {
	if r.lastIdle > 0 && r.lastIdle <= rxMini/2 {
		r.buf = r.mini[:]
		return r.buf
	}
	r.buf = stagingFree.get()[:]
	r.q.rxStaged.Store(true)
	return r.buf
}

// inMini reports whether r's staging buffer is its small one.
func (r *rxState) inMini() bool { return r.isMini(r.buf) }

// isMini reports whether b is r's small staging buffer.
func (r *rxState) isMini(b []byte) bool {
	return len(b) == rxMini && &b[0] == &r.mini[0]
}

// putStaging gives b, r's staging buffer, back; nothing is staged in it.
func (r *rxState) putStaging(b []byte) {
	r.buf = nil
	if r.isMini(b) {
		return
	}
	r.q.rxStaged.Store(false)
	stagingFree.put((*[rxStaging]byte)(b))
}

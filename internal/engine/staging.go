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

// getStaging takes a staging buffer as r's and returns it.
func (r *rxState) getStaging() []byte {
	r.buf = stagingFree.get()[:]
	r.q.rxStaged.Store(true)
	return r.buf
}

// putStaging gives b, r's staging buffer, back; nothing is staged in it.
func (r *rxState) putStaging(b []byte) {
	r.buf = nil
	r.q.rxStaged.Store(false)
	stagingFree.put((*[rxStaging]byte)(b))
}

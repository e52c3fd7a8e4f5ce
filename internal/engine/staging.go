package engine

// The receive staging buffer (rxStaging bytes: headers, trailers and small
// payloads land in it) is taken from stagingFree while bytes are pending
// and given back when the queue pair waits for its peer with nothing
// staged: the link's ReadIdle gives it back as the read that finds the
// socket empty parks, and takes one when bytes come (see receive).
// Thousands of queue pairs that wait hold none; one that streams keeps
// its own.

var stagingFree = newFreeList(func() *[rxStaging]byte { return new([rxStaging]byte) })

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

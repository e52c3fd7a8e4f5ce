package cm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
)

// gowarp's offer of a same-host shared-memory link rides, like the
// extensions' (ext.go), in a block at the end of the MPA private data,
// after the extensions' block if both are there. The initiator creates a
// file in /dev/shm holding the rings (layout below), maps it and names
// it in its offer with a random token it wrote into the file. A
// responder that accepts opens the file, checks that the token in it is
// the offer's (the initiator wrote that file on this host: a peer
// elsewhere cannot), writes a token of its own there, unlinks the file
// (both sides have it mapped: nothing is left behind if either is
// killed) and answers with a block carrying its token. The initiator
// takes the link only when its file holds the token of the answer (the
// responder mapped that same file). Either side's private data reaches
// its application without the block. A responder answers only an offer,
// and the initiator offers only when asked and only where the peer can
// be on this host (a loopback or local address), so any other peer (siw,
// rdma-core's tools, a raw peer) gets the stream as before, byte for
// byte.
//
// The block (big-endian):
//
//	0  version   2 (1 was a ring of bare bytes: such a peer gets the stream)
//	1  flags     0
//	2  name len  bytes of name in use (0 in an answer)
//	3  reserved  0
//	4  ring      bytes of each direction's ring: a power of two
//	8  token     16 random bytes: the initiator's (offer), the responder's (answer)
//	24 name      the file's name in /dev/shm, zero-padded (36 bytes)
//	60 "gwS1"    magic
const (
	shmBlockLen   = 64
	shmVersion    = 2 // 2: the ring carries records (engine: link_shm.go)
	shmNameMax    = 36
	shmNamePrefix = "gowarp-shm-"
	// ShmMinRing and ShmMaxRing bound a ring's size; ShmDefaultRing is
	// the size offered when the options say none. A ring that fits in
	// a core's L2 cache beside the buffers it is copied from and to
	// moves more: two processes on this project's 2-core VM (2 MiB of
	// L2 a core), 64 KiB write_bw, gave 14.3 GB/s with 1 MiB rings and
	// 9.6 with 4 MiB pinned to a CPU each, 8.3-10.4 against 5.8-6.0
	// sharing one, and medians of 12.4 against 10.7 unpinned (4 runs;
	// 512 KiB 12.3, 2 MiB 11.4, 256 KiB 11.2).
	ShmMinRing     = 64 << 10
	ShmMaxRing     = 64 << 20
	ShmDefaultRing = 1 << 20
)

var shmMagic = [4]byte{'g', 'w', 'S', '1'}

// ErrShmOffer: a shared-memory offer or answer is malformed.
var ErrShmOffer = errors.New("gowarp: malformed shared-memory block")

// shmBlock is an offer (Name set) or an answer.
type shmBlock struct {
	Ring  uint32
	Token [16]byte
	Name  string
}

// appendShm appends the block b to pd (see blocks.go).
func appendShm(pd []byte, b *shmBlock) []byte {
	out := append(pd, shmVersion, 0, byte(len(b.Name)), 0)
	out = binary.BigEndian.AppendUint32(out, b.Ring)
	out = append(out, b.Token[:]...)
	var name [shmNameMax]byte
	copy(name[:], b.Name)
	out = append(out, name[:]...)
	return append(out, shmMagic[:]...)
}

// cutShm reports whether pd ends with a shared-memory block and returns pd
// without it, and the block. A block that is there but malformed is cut
// all the same and reported with err (matching ErrShmOffer): it was meant
// for gowarp, and is refused.
func cutShm(pd []byte) (rest []byte, b shmBlock, present bool, err error) {
	n := len(pd) - shmBlockLen
	if n < 0 || !bytes.Equal(pd[len(pd)-4:], shmMagic[:]) {
		return pd, shmBlock{}, false, nil
	}
	b, err = parseShm(pd[n:])
	return pd[:n:n], b, true, err
}

// parseShm decodes a block of shmBlockLen bytes, checking every field.
func parseShm(p []byte) (shmBlock, error) {
	var b shmBlock
	if len(p) != shmBlockLen {
		return b, fmt.Errorf("%w: %d bytes", ErrShmOffer, len(p))
	}
	if p[0] != shmVersion {
		return b, fmt.Errorf("%w: version %d", ErrShmOffer, p[0])
	}
	if p[1] != 0 || p[3] != 0 {
		return b, fmt.Errorf("%w: reserved bits set", ErrShmOffer)
	}
	b.Ring = binary.BigEndian.Uint32(p[4:])
	if b.Ring < ShmMinRing || b.Ring > ShmMaxRing || b.Ring&(b.Ring-1) != 0 {
		return b, fmt.Errorf("%w: ring of %d bytes (want a power of two in [%d, %d])", ErrShmOffer, b.Ring, ShmMinRing, ShmMaxRing)
	}
	copy(b.Token[:], p[8:24])
	nl := int(p[2])
	if nl > shmNameMax {
		return b, fmt.Errorf("%w: name of %d bytes", ErrShmOffer, nl)
	}
	name := p[24 : 24+shmNameMax]
	for _, c := range name[nl:] {
		if c != 0 {
			return b, fmt.Errorf("%w: name not zero-padded", ErrShmOffer)
		}
	}
	b.Name = string(name[:nl])
	if nl > 0 && !validShmName(b.Name) {
		return b, fmt.Errorf("%w: name %q is not a gowarp file in /dev/shm", ErrShmOffer, b.Name)
	}
	return b, nil
}

// validShmName reports whether name is one gowarp gives its files: the
// prefix and lower-case hex digits, so no path can be named.
func validShmName(name string) bool {
	hex, ok := strings.CutPrefix(name, shmNamePrefix)
	if !ok || hex == "" {
		return false
	}
	for _, c := range []byte(hex) {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ringSize is the ring the options ask for: 0 means ShmDefaultRing, and
// the rest is rounded up to a power of two within the bounds.
func ringSize(n int) int {
	if n <= 0 {
		return ShmDefaultRing
	}
	n = min(max(n, ShmMinRing), ShmMaxRing)
	r := ShmMinRing
	for r < n {
		r <<= 1
	}
	return r
}

// sameHost reports whether c is a TCP connection whose peer has an
// address of this host: loopback, or one of the local interfaces'.
// Only there can the peer map a file in this host's /dev/shm. TLS and
// other streams are left alone: the user chose them over the socket.
func sameHost(c net.Conn) bool {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return false
	}
	ra, ok := tc.RemoteAddr().(*net.TCPAddr)
	if !ok {
		return false
	}
	if ra.IP.IsLoopback() {
		return true
	}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.Equal(ra.IP) {
			return true
		}
	}
	return false
}

// The shared file: a page of the connection manager's, then one page of
// counters per ring, then the rings, initiator→responder first.
//
//	0  "gowarp-shm\0\0\0\0\0\1"  magic and version (16 bytes)
//	16 ring                      bytes of each ring (uint32, native order)
//	24 initiator token (16)
//	40 responder token (16)
const (
	shmPage        = 4096
	shmTokI        = 24
	shmTokR        = 40
	ShmCtrlOff     = shmPage // the first ring's counters; the second's a page on
	ShmDataOff     = 3 * shmPage
	shmFileMagicSz = 16
)

var shmFileMagic = [shmFileMagicSz]byte{'g', 'o', 'w', 'a', 'r', 'p', '-', 's', 'h', 'm', 0, 0, 0, 0, 0, 1}

// shmFileSize is the size of the file for rings of ring bytes.
func shmFileSize(ring int) int { return ShmDataOff + 2*ring }

// SharedMemory is a mapped shared-memory link's file, as negotiated: the
// engine runs its rings (ShmCtrlOff, ShmDataOff) and unmaps it once.
type SharedMemory struct {
	// Mem is the whole mapping.
	Mem []byte
	// Ring is the bytes of each direction's ring.
	Ring int
	// Initiator: this side writes the first ring and reads the second.
	Initiator bool
}

// Ctrl returns the counters page of ring i (0: initiator→responder).
func (m *SharedMemory) Ctrl(i int) []byte {
	off := ShmCtrlOff + i*shmPage
	return m.Mem[off : off+shmPage : off+shmPage]
}

// Data returns ring i's bytes.
func (m *SharedMemory) Data(i int) []byte {
	off := ShmDataOff + i*m.Ring
	return m.Mem[off : off+m.Ring : off+m.Ring]
}

// ID returns the initiator's token, which names the file's link.
func (m *SharedMemory) ID() (id [16]byte) {
	copy(id[:], m.Mem[shmTokI:])
	return id
}

// Unmap unmaps the file. Nothing may touch Mem after it.
func (m *SharedMemory) Unmap() error {
	if m == nil || m.Mem == nil {
		return nil
	}
	err := unmapShm(m.Mem)
	m.Mem = nil
	return err
}

// errShmNotLocal: the peer is not on this host, as far as its address
// tells.
var errShmNotLocal = errors.New("gowarp: shared memory: the peer's address is not this host's")

// errShmDeclined: the responder answered the offer with no block.
var errShmDeclined = errors.New("gowarp: shared memory: the responder did not take the offer")

// offerShm creates the initiator's file, if the options ask for shared
// memory and the peer may be on this host; err says why there is none.
func offerShm(c net.Conn, o *Options) (*shmOffer, error) {
	if !o.Shm {
		return nil, nil
	}
	if !sameHost(c) {
		return nil, errShmNotLocal
	}
	offer, err := createShm(ringSize(o.ShmRing))
	if err != nil {
		return nil, fmt.Errorf("gowarp: shared memory: %w", err)
	}
	return offer, nil
}

// answerShm takes the responder's answer to offer from the end of its
// private data pd. Only an answer whose token is in the file counts
// (the responder mapped it); anything else leaves pd as it came (a
// foreign peer's bytes, for its application) and the offer untaken,
// with the reason.
func answerShm(pd []byte, offer *shmOffer) ([]byte, *SharedMemory, error) {
	rest, got, _ := cutBlocks(pd, false, false, true) // no tenant: no error
	switch {
	case got.shm == nil:
		return pd, nil, errShmDeclined
	case got.shmErr != nil:
		return pd, nil, got.shmErr
	case !offer.taken(got.shm):
		return pd, nil, fmt.Errorf("%w: the answer's token is not in the offered file", ErrShmOffer)
	}
	return rest, offer.m, nil
}

// takeShm maps the file the request offers, or says why not.
func (r *Request) takeShm() (*SharedMemory, *shmBlock, error) {
	switch {
	case r.shmErr != nil:
		return nil, nil, r.shmErr
	case r.shm.Name == "":
		return nil, nil, fmt.Errorf("%w: an offer names no file", ErrShmOffer)
	case !sameHost(r.c):
		return nil, nil, errShmNotLocal
	}
	m, ans, err := openShm(r.shm)
	if err != nil && !errors.Is(err, ErrShmOffer) {
		err = fmt.Errorf("gowarp: shared memory: %w", err)
	}
	if err != nil {
		return nil, nil, err
	}
	return m, ans, nil
}

// OffersShm reports whether the initiator offered a shared-memory link.
func (r *Request) OffersShm() bool { return r.shm != nil }

// LinkTimeout returns the bound the link timeout option d sets: d, the
// default for 0, none (0) for a negative d.
func LinkTimeout(d time.Duration) time.Duration { return linkTimeout(d) }

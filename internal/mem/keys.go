package mem

import (
	"errors"
	"fmt"
)

// Semantics is what an access through one key of a region means (the
// STag's 8-bit key names it, capability C9). A region has the semantics
// of its own key, chosen at registration, and any number of further keys
// (Expose), each with its own.
type Semantics uint8

const (
	// Plain is ordinary memory: a Write is placed, a Read is served from
	// the region as it is.
	Plain Semantics = iota
	// Durable makes a Write through the key reach the backing file's
	// stable storage (msync of the pages it touched) before the queue pair
	// processes anything that follows it. File-backed regions only.
	Durable
	// ReadThrough makes a Read through the key fill the pages it serves
	// from the file first: the kernel is asked for all of them at once
	// (MADV_WILLNEED) before the Read Response is framed, and the pages
	// are faulted in by the goroutine serving this queue pair, never by
	// another's. File-backed regions only.
	ReadThrough
	// Detached keeps a key valid but out of reach of the region's memory:
	// an access through it succeeds and reaches the region's sink (see
	// Detach). Retire gives a key these semantics.
	Detached
	numSemantics
)

func (s Semantics) String() string {
	switch s {
	case Plain:
		return "plain"
	case Durable:
		return "durable"
	case ReadThrough:
		return "read-through"
	case Detached:
		return "detached"
	}
	return fmt.Sprintf("semantics(%d)", uint8(s))
}

// Errors of Expose.
var (
	ErrNotFile      = errors.New("gowarp: the semantics needs a file-backed region")
	ErrBadSemantics = errors.New("gowarp: unknown semantics")
	ErrNoKeys       = errors.New("gowarp: every key of the region is in use")
	ErrKeyInUse     = errors.New("gowarp: the region has that key already")
)

// keySet is a region's further keys and their semantics; it is never
// changed once published (see Region.keys).
type keySet struct {
	has [4]uint64 // bit k: key k exposed
	sem [256]Semantics
}

func (k *keySet) contains(key uint8) bool { return k.has[key>>6]&(1<<(key&63)) != 0 }

// hasKey reports whether key is one of the region's further keys.
func (r *Region) hasKey(key uint8) bool {
	k := r.keys.Load()
	return k != nil && k.contains(key)
}

// Semantics returns the semantics an access through key has, and false
// if the region has no such key.
func (r *Region) Semantics(key uint8) (Semantics, bool) {
	if key == r.stag.Key() {
		return r.sem, true
	}
	if k := r.keys.Load(); k != nil && k.contains(key) {
		return k.sem[key], true
	}
	return 0, false
}

// Expose gives the region one more key, with semantics s, and returns the
// STag that carries it. The key is drawn at random (as registration draws
// one) unless fixed is set, when it is key. Durable and ReadThrough need a
// file-backed region.
func (r *Region) Expose(s Semantics, key uint8, fixed bool) (STag, error) {
	if err := r.checkSemantics(s); err != nil {
		return 0, err
	}
	t := r.table
	t.mu.Lock()
	defer t.mu.Unlock()
	if !r.valid.Load() {
		return 0, ErrInvalid
	}
	if t.frozen.Load() {
		return 0, ErrFrozen
	}
	old := r.keys.Load()
	used := func(k uint8) bool { return k == r.stag.Key() || old != nil && old.contains(k) }
	if fixed {
		if used(key) {
			return 0, fmt.Errorf("%w: %#02x", ErrKeyInUse, key)
		}
	} else {
		free := 0
		for k := range 256 {
			if !used(uint8(k)) {
				free++
			}
		}
		if free == 0 {
			return 0, ErrNoKeys
		}
		for key = uint8(t.rng.Uint64()); used(key); key = uint8(t.rng.Uint64()) {
		}
	}
	n := &keySet{}
	if old != nil {
		*n = *old
	}
	n.has[key>>6] |= 1 << (key & 63)
	n.sem[key] = s
	r.keys.Store(n)
	return STag(r.stag.Index()<<8 | uint32(key)), nil
}

// Revoke removes a key Expose gave: accesses through it fail as through
// an unknown STag from then on. The region's own key cannot be revoked
// (Deregister the region). Accesses already under way finish.
func (r *Region) Revoke(s STag) error {
	return r.changeKey(s, func(n *keySet) {
		n.has[s.Key()>>6] &^= 1 << (s.Key() & 63)
		n.sem[s.Key()] = Plain
	})
}

// Retire gives a key Expose gave the semantics Detached: accesses through
// it succeed from then on, but reach the region's sink, not its memory.
// For a key peers may still hold when what it named is gone (a block
// reused under a new key): an access through a revoked key is an invalid
// STag, which RFC 5040 answers with a Terminate that ends the peer's
// connection and all its other work; through a retired key the access
// completes, and the peer learns from what it reads that its address is
// stale. Accesses already under way finish in the memory (see InUse).
// Revoke the key to end it.
func (r *Region) Retire(s STag) error {
	r.makeSink() // before the key changes: who sees the key sees the sink
	return r.changeKey(s, func(n *keySet) { n.sem[s.Key()] = Detached })
}

// changeKey publishes the region's keys with f applied to a copy, if s is
// one Expose gave.
func (r *Region) changeKey(s STag, f func(n *keySet)) error {
	t := r.table
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.frozen.Load() {
		return ErrFrozen
	}
	old := r.keys.Load()
	if s.Index() != r.stag.Index() || old == nil || !old.contains(s.Key()) {
		return fmt.Errorf("%w: %v is not an exposed key of the region", ErrInvalid, s)
	}
	n := &keySet{}
	*n = *old
	f(n)
	r.keys.Store(n)
	return nil
}

func (r *Region) checkSemantics(s Semantics) error {
	switch {
	case s >= numSemantics:
		return fmt.Errorf("%w: %d", ErrBadSemantics, uint8(s))
	case s == Detached:
		return fmt.Errorf("%w: a key is made detached by Retire", ErrBadSemantics)
	case s != Plain && r.file == nil:
		return fmt.Errorf("%w: %v", ErrNotFile, s)
	}
	return nil
}

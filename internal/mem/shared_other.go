//go:build !linux

package mem

// RegisterShared registers n bytes of new, zeroed memory. Only Linux
// shares it with peers; elsewhere it is ordinary memory.
func (t *Table) RegisterShared(pd uint32, n int, access Access, o Options) (*Region, error) {
	if n <= 0 {
		return nil, ErrEmpty
	}
	return t.Register(pd, [][]byte{make([]byte, n)}, access, o)
}

func (s *Shared) free() error { return nil }

// RegisterAnon registers n bytes of new, zeroed memory; on Linux it is
// mapped outside the Go heap, elsewhere it is ordinary memory, as
// RegisterShared's is.
func (t *Table) RegisterAnon(pd uint32, n int, access Access, o Options) (*Region, error) {
	return t.RegisterShared(pd, n, access, o)
}

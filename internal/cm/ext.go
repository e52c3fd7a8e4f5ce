package cm

import "bytes"

// gowarp's offer of RFC 7306's extensions (Immediate Data, Atomic
// Operations) rides at the end of the MPA private data: RFC 7306 leaves
// their negotiation to the ULP, and MPA has no field for it. The block is
// extMagic followed by a 4-byte feature word (reserved, 0 for now: the
// block's presence offers both extensions). An initiator adds it only
// when asked (ConnectOptions.Extensions), so a peer such as siw, whose
// applications read the private data, never sees it unless the user
// chose to; a responder answers with a block only to a request that
// carried one; each side strips the peer's block before the application
// sees the private data. At the end rather than the front, an
// application that reads a fixed header from the private data still
// finds it where it was.
const extBlockLen = 8

var extMagic = [4]byte{'g', 'w', 'X', '1'}

// appendExt appends the offer block to pd (see blocks.go).
func appendExt(pd []byte) []byte {
	return append(append(pd, extMagic[:]...), 0, 0, 0, 0)
}

// cutExt reports whether pd ends with an offer block and returns pd
// without it.
func cutExt(pd []byte) ([]byte, bool) {
	n := len(pd) - extBlockLen
	if n < 0 || !bytes.Equal(pd[n:n+4], extMagic[:]) {
		return pd, false
	}
	return pd[:n:n], true
}

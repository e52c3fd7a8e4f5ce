package engine

import "github.com/gowarp/gowarp/wire"

// extOK reports whether the receive core takes RFC 7306's opcode op:
// only from a peer that negotiated the extensions, and only those gowarp
// carries out (Immediate Data; an Atomic Request or Response is refused
// as an unexpected opcode, as from a peer without them).
func (r *rxState) extOK(op wire.Opcode) bool {
	return r.q.params.Ext && (op == wire.OpImmediate || op == wire.OpImmediateSE)
}

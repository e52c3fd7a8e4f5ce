package mem

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// The export format of an STag table (capability C12): a stream of
// records, each checked by its own CRC32c, so that a table moves between
// nodes over any byte stream (a TCP connection, a file) and a corrupt or
// truncated stream is refused before anything of it is registered.
//
//	record  = kind u8 | body length u16 | body | crc32c(kind, length, body) u32
//	stream  = header record ('H')
//	          { region record ('R') [ content | crc32c(content) u32 ] }
//	          end record ('E')
//
// A memory region's record is followed by its content, Length bytes and
// their CRC; a file region's is not: its record names the file, which the
// importing node maps again (see Table.Export). All integers are big
// endian, as on the wire.
//
// This file is the pure codec: it parses and appends records and does no
// I/O; every parser checks lengths before it reads and never panics.

// TableFormatVersion is the version of the export format this code writes
// and reads.
const TableFormatVersion = 1

// Record kinds.
const (
	recHeader = 'H'
	recRegion = 'R'
	recEnd    = 'E'
)

// recPrefix is a record's kind and body length; recCRC its trailing CRC.
const (
	recPrefix = 3
	recCRC    = 4
	// MaxRecordBody bounds a record's body (the u16 length allows no more).
	MaxRecordBody = 1<<16 - 1
)

// ErrBadExport is an export stream that cannot be imported: a bad magic,
// version, length, CRC or field, or a stream cut short.
var ErrBadExport = errors.New("gowarp: bad table export stream")

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

var exportMagic = [4]byte{'G', 'W', 'S', 'T'}

// ExportHeader opens an export stream.
type ExportHeader struct {
	Version  uint16
	Regions  uint32 // how many region records follow
	PDs      uint32 // how many protection domains they belong to
	Identity string // the exporting table's identity, for the importer's information
}

// ExportRegion describes one region of an export.
type ExportRegion struct {
	STag      STag
	PD        uint32 // the ordinal of its protection domain, < ExportHeader.PDs
	Access    Access
	Semantics Semantics // of the STag's own key
	Base      uint64
	Length    uint64
	Placed    uint64
	Keys      []ExportKey // the further keys (Expose)
	// File is the path of the file a file region maps (empty for memory)
	// and FileOff the offset of the region's first byte in it.
	File    string
	FileOff int64
}

// ExportKey is one further key of a region and its semantics.
type ExportKey struct {
	Key       uint8
	Semantics Semantics
}

// ExportEnd closes an export stream, repeating its totals.
type ExportEnd struct {
	Regions uint32
	Bytes   uint64 // content bytes in the stream
}

// AppendRecord appends a record of kind with body b.
func AppendRecord(dst []byte, kind byte, body []byte) ([]byte, error) {
	if len(body) > MaxRecordBody {
		return dst, fmt.Errorf("%w: record body of %d bytes", ErrBadExport, len(body))
	}
	start := len(dst)
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(body)))
	dst = append(dst, body...)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli)), nil
}

// RecordLen returns the length of the record that b begins with, from its
// prefix alone (b holds at least recPrefix bytes).
func RecordLen(prefix []byte) (int, error) {
	if len(prefix) < recPrefix {
		return 0, fmt.Errorf("%w: record prefix of %d bytes", ErrBadExport, len(prefix))
	}
	return recPrefix + int(binary.BigEndian.Uint16(prefix[1:])) + recCRC, nil
}

// ParseRecord parses the record b begins with, checking its CRC: it
// returns the kind, the body (a sub-slice of b) and the bytes consumed.
func ParseRecord(b []byte) (kind byte, body []byte, n int, err error) {
	if len(b) < recPrefix {
		return 0, nil, 0, fmt.Errorf("%w: truncated record", ErrBadExport)
	}
	n, _ = RecordLen(b)
	if len(b) < n {
		return 0, nil, 0, fmt.Errorf("%w: truncated record (%d of %d bytes)", ErrBadExport, len(b), n)
	}
	if got, want := crc32.Checksum(b[:n-recCRC], castagnoli), binary.BigEndian.Uint32(b[n-recCRC:n]); got != want {
		return 0, nil, 0, fmt.Errorf("%w: record CRC %#08x, expected %#08x", ErrBadExport, got, want)
	}
	return b[0], b[recPrefix : n-recCRC], n, nil
}

// Append appends the header's body.
func (h *ExportHeader) Append(dst []byte) []byte {
	dst = append(dst, exportMagic[:]...)
	dst = binary.BigEndian.AppendUint16(dst, h.Version)
	dst = binary.BigEndian.AppendUint32(dst, h.Regions)
	dst = binary.BigEndian.AppendUint32(dst, h.PDs)
	dst = append(dst, byte(len(h.Identity)))
	return append(dst, h.Identity...)
}

const headerFixed = 4 + 2 + 4 + 4 + 1

// ParseExportHeader parses a header record's body.
func ParseExportHeader(b []byte) (ExportHeader, error) {
	var h ExportHeader
	if len(b) < headerFixed {
		return h, fmt.Errorf("%w: header of %d bytes", ErrBadExport, len(b))
	}
	if [4]byte(b[:4]) != exportMagic {
		return h, fmt.Errorf("%w: not a gowarp table export (magic %q)", ErrBadExport, b[:4])
	}
	h.Version = binary.BigEndian.Uint16(b[4:])
	if h.Version != TableFormatVersion {
		return h, fmt.Errorf("%w: format version %d, this build reads %d", ErrBadExport, h.Version, TableFormatVersion)
	}
	h.Regions = binary.BigEndian.Uint32(b[6:])
	h.PDs = binary.BigEndian.Uint32(b[10:])
	n := int(b[14])
	if len(b) != headerFixed+n {
		return h, fmt.Errorf("%w: header of %d bytes, its identity says %d", ErrBadExport, len(b), headerFixed+n)
	}
	if h.PDs > h.Regions {
		return h, fmt.Errorf("%w: %d protection domains for %d regions", ErrBadExport, h.PDs, h.Regions)
	}
	h.Identity = string(b[headerFixed:])
	return h, nil
}

// regionFixed is the fixed part of a region record's body: STag, PD,
// access, semantics, file flag, key count, base, length, placed, file
// offset, path length.
const regionFixed = 4 + 4 + 1 + 1 + 1 + 2 + 8 + 8 + 8 + 8 + 2

// Append appends the region record's body; it fails if the record would
// not fit (a path too long).
func (e *ExportRegion) Append(dst []byte) ([]byte, error) {
	if n := regionFixed + 2*len(e.Keys) + len(e.File); n > MaxRecordBody {
		return dst, fmt.Errorf("%w: region record of %d bytes (file path of %d)", ErrBadExport, n, len(e.File))
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(e.STag))
	dst = binary.BigEndian.AppendUint32(dst, e.PD)
	var file byte
	if e.File != "" {
		file = 1
	}
	dst = append(dst, byte(e.Access), byte(e.Semantics), file)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(e.Keys)))
	dst = binary.BigEndian.AppendUint64(dst, e.Base)
	dst = binary.BigEndian.AppendUint64(dst, e.Length)
	dst = binary.BigEndian.AppendUint64(dst, e.Placed)
	dst = binary.BigEndian.AppendUint64(dst, uint64(e.FileOff))
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(e.File)))
	for _, k := range e.Keys {
		dst = append(dst, k.Key, byte(k.Semantics))
	}
	return append(dst, e.File...), nil
}

// ParseExportRegion parses a region record's body and checks what can be
// checked without a table: the fields' ranges and the keys.
func ParseExportRegion(b []byte) (ExportRegion, error) {
	var e ExportRegion
	if len(b) < regionFixed {
		return e, fmt.Errorf("%w: region record of %d bytes", ErrBadExport, len(b))
	}
	e.STag = STag(binary.BigEndian.Uint32(b[0:]))
	e.PD = binary.BigEndian.Uint32(b[4:])
	e.Access, e.Semantics = Access(b[8]), Semantics(b[9])
	file := b[10]
	nkeys := int(binary.BigEndian.Uint16(b[11:]))
	e.Base = binary.BigEndian.Uint64(b[13:])
	e.Length = binary.BigEndian.Uint64(b[21:])
	e.Placed = binary.BigEndian.Uint64(b[29:])
	off := binary.BigEndian.Uint64(b[37:])
	npath := int(binary.BigEndian.Uint16(b[45:]))
	if len(b) != regionFixed+2*nkeys+npath {
		return e, fmt.Errorf("%w: region record of %d bytes, its counts say %d", ErrBadExport, len(b), regionFixed+2*nkeys+npath)
	}
	switch {
	case e.STag.Index() == 0:
		return e, fmt.Errorf("%w: STag %v has index 0", ErrBadExport, e.STag)
	case e.Access&^(LocalWrite|RemoteRead|RemoteWrite|RemoteInvalidate|RemoteAtomic) != 0:
		return e, fmt.Errorf("%w: access %#x", ErrBadExport, uint8(e.Access))
	case e.Semantics >= numSemantics || e.Semantics == Detached: // a region's own key is never retired
		return e, fmt.Errorf("%w: semantics %d", ErrBadExport, uint8(e.Semantics))
	case e.Length == 0 || e.Base+e.Length < e.Base:
		return e, fmt.Errorf("%w: region of %d bytes at %#x", ErrBadExport, e.Length, e.Base)
	case file > 1 || (file == 1) != (npath > 0):
		return e, fmt.Errorf("%w: file flag %d with a path of %d bytes", ErrBadExport, file, npath)
	case off > 1<<63-1 || (file == 0 && off != 0):
		return e, fmt.Errorf("%w: file offset %d", ErrBadExport, off)
	case nkeys > 255:
		return e, fmt.Errorf("%w: %d further keys", ErrBadExport, nkeys)
	}
	e.FileOff = int64(off)
	if nkeys > 0 {
		e.Keys = make([]ExportKey, nkeys)
		var seen [4]uint64
		own := e.STag.Key()
		seen[own>>6] |= 1 << (own & 63)
		for i := range e.Keys {
			k := ExportKey{Key: b[regionFixed+2*i], Semantics: Semantics(b[regionFixed+2*i+1])}
			if seen[k.Key>>6]&(1<<(k.Key&63)) != 0 || k.Semantics >= numSemantics {
				return e, fmt.Errorf("%w: key %#02x (semantics %d) repeated or unknown", ErrBadExport, k.Key, k.Semantics)
			}
			seen[k.Key>>6] |= 1 << (k.Key & 63)
			e.Keys[i] = k
		}
	}
	e.File = string(b[regionFixed+2*nkeys:])
	if e.File == "" {
		for _, k := range append(e.Keys, ExportKey{Semantics: e.Semantics}) {
			if k.Semantics != Plain && k.Semantics != Detached {
				return e, fmt.Errorf("%w: %v semantics on a memory region", ErrBadExport, k.Semantics)
			}
		}
	}
	return e, nil
}

// Append appends the end record's body.
func (e *ExportEnd) Append(dst []byte) []byte {
	dst = binary.BigEndian.AppendUint32(dst, e.Regions)
	return binary.BigEndian.AppendUint64(dst, e.Bytes)
}

// ParseExportEnd parses an end record's body.
func ParseExportEnd(b []byte) (ExportEnd, error) {
	if len(b) != 12 {
		return ExportEnd{}, fmt.Errorf("%w: end record of %d bytes", ErrBadExport, len(b))
	}
	return ExportEnd{Regions: binary.BigEndian.Uint32(b), Bytes: binary.BigEndian.Uint64(b[4:])}, nil
}

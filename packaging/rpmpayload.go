package packaging

import (
	"bytes"
	"compress/gzip"
	"crypto/md5"
	"crypto/sha1"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strconv"
)

// The RPM writer nfpm uses names every cpio member of the payload with its
// absolute path (/usr/bin/drover-agent). rpm itself places files by the
// header's file list, so installing works, but every tool that unpacks the
// payload directly — `rpm2cpio x.rpm | cpio -id`, which rpmlint runs, as
// root on many build hosts — writes straight into /. rpmbuild names the
// members ./usr/bin/drover-agent; RelativizeRPM rewrites a built package that
// way and updates the digests that cover the payload, so the package passes
// `rpm -K` and unpacks where it is told.

// Header tags RelativizeRPM reads or updates (rpmtag.h).
const (
	rpmSigSHA1          = 269  // RPMSIGTAG_SHA1: hex SHA-1 of the header
	rpmSigLongSize      = 270  // RPMSIGTAG_LONGSIZE: header + payload
	rpmSigSHA256        = 273  // RPMSIGTAG_SHA256: hex SHA-256 of the header
	rpmSigSize          = 1000 // RPMSIGTAG_SIZE: header + payload
	rpmSigMD5           = 1004 // RPMSIGTAG_MD5: MD5 of header + payload
	rpmTagPayloadFormat = 1124
	rpmTagPayloadComp   = 1125
	rpmTagPayloadDigest = 5092 // hex SHA-256 of the compressed payload
	rpmTagPayloadDigAlt = 5097 // hex SHA-256 of the uncompressed payload
)

// rpmSignatureTags are the OpenPGP signatures a header may carry: a signed
// package cannot be rewritten without its key.
var rpmSignatureTags = []int{256, 259, 267, 268, 1002, 1005} // RSA, DSA, ..., PGP, GPG

type rpmEntry struct{ tag, typ, off, count int }

// rpmHeader is one header structure (the signature or the main header)
// inside a package's bytes.
type rpmHeader struct {
	start, storeStart, end int // offsets in the package
	entries                map[int]rpmEntry
}

func parseRPMHeader(b []byte, at int) (rpmHeader, error) {
	h := rpmHeader{start: at, entries: map[int]rpmEntry{}}
	if len(b) < at+16 || !bytes.Equal(b[at:at+3], []byte{0x8e, 0xad, 0xe8}) {
		return h, fmt.Errorf("no header structure at offset %d", at)
	}
	n := int(binary.BigEndian.Uint32(b[at+8:]))
	size := int(binary.BigEndian.Uint32(b[at+12:]))
	if n > 1<<16 || size > 64<<20 {
		return h, fmt.Errorf("header at %d: %d entries, %d bytes: too large", at, n, size)
	}
	h.storeStart = at + 16 + 16*n
	h.end = h.storeStart + size
	if len(b) < h.end {
		return h, fmt.Errorf("header at %d: truncated", at)
	}
	for i := range n {
		e := b[at+16+16*i:]
		r := rpmEntry{
			tag: int(binary.BigEndian.Uint32(e)), typ: int(binary.BigEndian.Uint32(e[4:])),
			off: int(binary.BigEndian.Uint32(e[8:])), count: int(binary.BigEndian.Uint32(e[12:])),
		}
		if r.off < 0 || r.off >= size {
			return h, fmt.Errorf("header at %d: tag %d points outside the store", at, r.tag)
		}
		h.entries[r.tag] = r
	}
	return h, nil
}

// str returns the value of a STRING (6) or one-element STRING_ARRAY (8) tag
// and its absolute offset.
func (h rpmHeader) str(b []byte, tag int) (string, int, bool) {
	e, ok := h.entries[tag]
	if !ok || (e.typ != 6 && e.typ != 8) {
		return "", 0, false
	}
	at := h.storeStart + e.off
	n := bytes.IndexByte(b[at:h.end], 0)
	if n < 0 {
		return "", 0, false
	}
	return string(b[at : at+n]), at, true
}

// setStr overwrites a string tag with a value of the same length (digests).
func (h rpmHeader) setStr(b []byte, tag int, v string) error {
	old, at, ok := h.str(b, tag)
	if !ok {
		return fmt.Errorf("tag %d is not a string", tag)
	}
	if len(old) != len(v) {
		return fmt.Errorf("tag %d: new value has %d bytes, old %d", tag, len(v), len(old))
	}
	copy(b[at:], v)
	return nil
}

func (h rpmHeader) setInt(b []byte, tag int, v uint64) error {
	e := h.entries[tag]
	at := h.storeStart + e.off
	switch e.typ {
	case 4: // INT32
		if v > 1<<32-1 {
			return fmt.Errorf("tag %d: %d does not fit in 32 bits", tag, v)
		}
		binary.BigEndian.PutUint32(b[at:], uint32(v))
	case 5: // INT64
		binary.BigEndian.PutUint64(b[at:], v)
	default:
		return fmt.Errorf("tag %d has type %d, not an integer", tag, e.typ)
	}
	return nil
}

// RelativizeRPM returns the package rpm with every cpio member of its
// payload named "./path" instead of "/path", the payload recompressed, and
// the payload digest (main header) and the header digests and sizes
// (signature header) updated. A package whose members are relative already
// comes back unchanged. Only gzip payloads and unsigned packages are
// handled (what mkpkg builds); anything else is an error.
func RelativizeRPM(rpm []byte) ([]byte, error) {
	if len(rpm) < 96 || !bytes.Equal(rpm[:4], []byte{0xed, 0xab, 0xee, 0xdb}) {
		return nil, errors.New("not an RPM package (no lead)")
	}
	sig, err := parseRPMHeader(rpm, 96)
	if err != nil {
		return nil, fmt.Errorf("signature header: %w", err)
	}
	for _, t := range rpmSignatureTags {
		if _, ok := sig.entries[t]; ok {
			return nil, fmt.Errorf("the package is signed (signature tag %d): rewrite before signing", t)
		}
	}
	hdrStart := sig.end + (8-(sig.end-sig.start)%8)%8
	hdr, err := parseRPMHeader(rpm, hdrStart)
	if err != nil {
		return nil, fmt.Errorf("main header: %w", err)
	}
	if f, _, _ := hdr.str(rpm, rpmTagPayloadFormat); f != "cpio" {
		return nil, fmt.Errorf("payload format %q, want cpio", f)
	}
	if c, _, _ := hdr.str(rpm, rpmTagPayloadComp); c != "gzip" {
		return nil, fmt.Errorf("payload compressor %q: only gzip is rewritten", c)
	}
	zr, err := gzip.NewReader(bytes.NewReader(rpm[hdr.end:]))
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("payload: %w", err)
	}
	rel, changed, err := RelativizeCpio(raw)
	if err != nil {
		return nil, err
	}
	if !changed {
		return rpm, nil
	}
	var z bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&z, gzip.BestCompression) // no name, no time: reproducible
	zw.Write(rel)
	if err := zw.Close(); err != nil {
		return nil, err
	}

	out := make([]byte, 0, hdr.end+z.Len())
	out = append(out, rpm[:hdr.end]...)
	out = append(out, z.Bytes()...)
	sum := sha256.Sum256(z.Bytes())
	if err := hdr.setStr(out, rpmTagPayloadDigest, hex.EncodeToString(sum[:])); err != nil {
		return nil, fmt.Errorf("payload digest: %w", err)
	}
	if _, ok := hdr.entries[rpmTagPayloadDigAlt]; ok {
		alt := sha256.Sum256(rel)
		if err := hdr.setStr(out, rpmTagPayloadDigAlt, hex.EncodeToString(alt[:])); err != nil {
			return nil, err
		}
	}
	header := out[hdr.start:hdr.end]
	if _, ok := sig.entries[rpmSigSHA256]; ok {
		s := sha256.Sum256(header)
		if err := sig.setStr(out, rpmSigSHA256, hex.EncodeToString(s[:])); err != nil {
			return nil, err
		}
	}
	if _, ok := sig.entries[rpmSigSHA1]; ok {
		s := sha1.Sum(header)
		if err := sig.setStr(out, rpmSigSHA1, hex.EncodeToString(s[:])); err != nil {
			return nil, err
		}
	}
	total := uint64(len(header) + z.Len())
	for _, t := range []int{rpmSigSize, rpmSigLongSize} {
		if _, ok := sig.entries[t]; ok {
			if err := sig.setInt(out, t, total); err != nil {
				return nil, err
			}
		}
	}
	if e, ok := sig.entries[rpmSigMD5]; ok {
		if e.typ != 7 || e.count != md5.Size {
			return nil, errors.New("MD5 signature tag is not 16 bytes")
		}
		s := md5.Sum(out[hdr.start:])
		copy(out[sig.storeStart+e.off:], s[:])
	}
	return out, nil
}

// RelativizeCpio renames every member of a newc ("070701") cpio archive from
// "/path" to "./path", keeping every other header field and the data, and
// reports whether anything changed. The trailer and relative members stay
// as they are.
func RelativizeCpio(a []byte) ([]byte, bool, error) {
	const hdrLen = 110
	pad4 := func(n int) int { return (4 - n%4) % 4 }
	var out bytes.Buffer
	out.Grow(len(a) + 4096)
	changed := false
	for off := 0; ; {
		if len(a) < off+hdrLen || string(a[off:off+6]) != "070701" {
			return nil, false, fmt.Errorf("cpio: no newc header at offset %d", off)
		}
		h := a[off : off+hdrLen]
		field := func(i int) (int, error) {
			v, err := strconv.ParseUint(string(h[6+8*i:6+8*i+8]), 16, 32)
			return int(v), err
		}
		size, err1 := field(6)
		nameSize, err2 := field(11)
		if err := errors.Join(err1, err2); err != nil || nameSize < 1 {
			return nil, false, fmt.Errorf("cpio: bad header at offset %d", off)
		}
		nameEnd := off + hdrLen + nameSize
		dataStart := nameEnd + pad4(hdrLen+nameSize)
		dataEnd := dataStart + size
		if len(a) < dataEnd {
			return nil, false, fmt.Errorf("cpio: member at offset %d is truncated", off)
		}
		name := string(a[off+hdrLen : nameEnd-1])
		next := dataEnd + pad4(size)
		if len(name) > 0 && name[0] == '/' {
			name = "." + name
			changed = true
		}
		nh := append([]byte{}, h...)
		copy(nh[6+8*11:], fmt.Sprintf("%08X", len(name)+1))
		out.Write(nh)
		out.WriteString(name)
		out.WriteByte(0)
		out.Write(make([]byte, pad4(hdrLen+len(name)+1)))
		out.Write(a[dataStart:dataEnd])
		out.Write(make([]byte, pad4(size)))
		if name == "TRAILER!!!" {
			// rpmpack, like cpio(1), pads the archive after the trailer.
			return out.Bytes(), changed, nil
		}
		off = next
	}
}

package protocol

import (
	"encoding/binary"
	"hash/crc32"
)

// PatchCRC sets the batch's CRC after a change to its header, given the
// header as it was (old, at least BatchHeaderSize bytes), without reading
// the records: the batch's bytes after the header need not be in b at all
// (a Produce whose batch bodies went into a pipe, produce_splice.go in
// proxy). A batch whose CRC was wrong before is wrong after, as it would
// be had the broker seen it unchanged; UpdateCRC would make it right.
//
// CRC-32C is affine: for messages of one length, crc(m') = crc(m) xor
// raw(m xor m'), where raw is the CRC with a zero initial value and no
// final inversion. The messages differ only in the header, so m xor m' is
// the header's difference followed by zeros, and raw of that is raw of the
// difference shifted by as many zero bytes: a multiplication by x^(8k)
// modulo the polynomial (as zlib's crc32_combine does).
func (b Batch) PatchCRC(old []byte) {
	var d [BatchHeaderSize - offAttributes]byte
	for i := range d {
		d[i] = old[offAttributes+i] ^ b[offAttributes+i]
	}
	r := ^crc32.Update(^uint32(0), castagnoli, d[:])
	r = multModP(x2nModP(uint64(len(b)-BatchHeaderSize), 3), r)
	binary.BigEndian.PutUint32(b[offCRC:], b.CRC()^r)
}

// castagnoliPoly is CRC-32C's polynomial, reflected as crc32 keeps it.
const castagnoliPoly = 0x82f63b78

// multModP is a*b modulo the polynomial, in the reflected representation
// (the coefficient of x^0 in the top bit).
func multModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		if b&1 != 0 {
			b = b>>1 ^ castagnoliPoly
		} else {
			b >>= 1
		}
	}
	return p
}

// x2nTable[k] is x^(2^k) modulo the polynomial.
var x2nTable = func() (t [32]uint32) {
	p := uint32(1) << 30 // x^1
	for k := range t {
		t[k] = p
		p = multModP(p, p)
	}
	return t
}()

// x2nModP is x^(n*2^k) modulo the polynomial.
func x2nModP(n uint64, k uint) uint32 {
	p := uint32(1) << 31 // x^0
	for ; n != 0; n >>= 1 {
		if n&1 != 0 {
			p = multModP(x2nTable[k&31], p)
		}
		k++
	}
	return p
}

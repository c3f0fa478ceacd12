package signing

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	ssldsse "github.com/secure-systems-lab/go-securesystemslib/dsse"
	sigdsse "github.com/sigstore/sigstore/pkg/signature/dsse"
)

// MaxSignatures bounds the signatures one envelope may carry.
const MaxSignatures = 8

// maxPayloadTypeLen bounds a payload type.
const maxPayloadTypeLen = 256

// b64 is the only payload and signature encoding accepted: standard base64
// with padding and zero trailing bits, so every byte string has exactly one
// encoding.
var b64 = base64.StdEncoding.Strict()

// Sign signs exactly payload as a DSSE envelope of the given payload type and
// returns the envelope's JSON. The signature carries s's key id.
func Sign(s *Signer, payloadType string, payload []byte) ([]byte, error) {
	if s == nil || s.sv == nil {
		return nil, errors.New("sign: nil signer")
	}
	if err := checkPayloadType(payloadType); err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	if len(payload) == 0 {
		return nil, errors.New("sign: empty payload")
	}
	es, err := ssldsse.NewEnvelopeSigner(&sigdsse.SignerAdapter{
		SignatureSigner: s.sv,
		Pub:             s.priv.Public(),
		PubKeyID:        s.pub.ID,
	})
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	env, err := es.SignPayload(context.Background(), payloadType, payload)
	if err != nil {
		return nil, fmt.Errorf("sign: %w", err)
	}
	b, err := json.Marshal(env)
	if err != nil {
		return nil, fmt.Errorf("sign: encode envelope: %w", err)
	}
	return b, nil
}

// checkPayloadType allows non-empty printable ASCII, which JSON carries
// unchanged.
func checkPayloadType(t string) error {
	if t == "" || len(t) > maxPayloadTypeLen {
		return fmt.Errorf("payload type must be 1-%d characters", maxPayloadTypeLen)
	}
	for i := 0; i < len(t); i++ {
		if t[i] < 0x21 || t[i] > 0x7e {
			return fmt.Errorf("payload type %q must be printable ASCII without spaces", t)
		}
	}
	return nil
}

// Verify checks the envelope's payload type equals payloadType and that a
// signature verifies under one of keys. Signatures are matched to keys by key
// id, and a key is only used if its ID is the hash of its own PEM key (a key
// id alone is never trusted). It returns the exact payload bytes and the id of
// the key that verified; it never parses the payload.
//
// Errors wrap ErrMalformedEnvelope, ErrPayloadType, ErrUnknownKey (no
// signature names a usable trusted key) or ErrBadSignature (a signature names
// a trusted key but does not verify).
func Verify(env []byte, payloadType string, keys []PublicKey) (payload []byte, keyID string, err error) {
	e, payload, err := parseEnvelope(env)
	if err != nil {
		return nil, "", err
	}
	if e.PayloadType != payloadType {
		return nil, "", fmt.Errorf("%w: got %q, want %q", ErrPayloadType, e.PayloadType, payloadType)
	}
	var bad, unusable error
	for _, sig := range e.Signatures {
		for _, k := range keys {
			if k.ID != sig.KeyID {
				continue
			}
			v, kerr := k.verifier()
			if kerr != nil {
				unusable = kerr
				continue
			}
			ev, verr := ssldsse.NewEnvelopeVerifier(&sigdsse.VerifierAdapter{
				SignatureVerifier: v,
				PubKeyID:          k.ID,
			})
			if verr != nil {
				return nil, "", fmt.Errorf("verify: %w", verr)
			}
			one := ssldsse.Envelope{PayloadType: e.PayloadType, Payload: e.Payload, Signatures: []ssldsse.Signature{sig}}
			accepted, body, verr := ev.VerifyAndDecode(context.Background(), &one)
			if verr != nil || len(accepted) != 1 || accepted[0].KeyID != k.ID {
				if verr == nil {
					verr = errors.New("not accepted")
				}
				bad = fmt.Errorf("%w: key %s: %w", ErrBadSignature, shortID(k.ID), verr)
				continue
			}
			// The strict and the library decoding agree on canonical base64;
			// return the bytes the signature was checked over.
			if !bytes.Equal(body, payload) {
				return nil, "", fmt.Errorf("%w: payload decodes ambiguously", ErrMalformedEnvelope)
			}
			return payload, k.ID, nil
		}
	}
	switch {
	case bad != nil:
		return nil, "", bad
	case unusable != nil:
		return nil, "", fmt.Errorf("%w: the trusted key named by the signature is unusable: %w", ErrUnknownKey, unusable)
	case len(keys) == 0:
		return nil, "", fmt.Errorf("%w: no trusted keys", ErrUnknownKey)
	}
	ids := make([]string, len(e.Signatures))
	for i, s := range e.Signatures {
		ids[i] = shortID(s.KeyID)
	}
	return nil, "", fmt.Errorf("%w: no trusted key matches key id %v", ErrUnknownKey, ids)
}

// parseEnvelope parses env strictly: one JSON object with exactly the fields
// payloadType, payload and signatures (exact case, each once), each signature
// an object with exactly keyid and sig, all strings non-empty, payload and sig
// canonical standard base64, and nothing but whitespace after the object. It
// returns the envelope and the decoded payload.
func parseEnvelope(env []byte) (*ssldsse.Envelope, []byte, error) {
	p := envParser{dec: json.NewDecoder(bytes.NewReader(env))}
	e := p.envelope()
	if p.err == nil {
		if _, err := p.dec.Token(); err != io.EOF {
			p.fail("trailing data after the envelope")
		}
	}
	if p.err != nil {
		return nil, nil, p.err
	}
	payload, err := decodeB64(e.Payload)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: payload: %w", ErrMalformedEnvelope, err)
	}
	if len(payload) == 0 {
		return nil, nil, fmt.Errorf("%w: empty payload", ErrMalformedEnvelope)
	}
	for i, s := range e.Signatures {
		if _, err := decodeB64(s.Sig); err != nil {
			return nil, nil, fmt.Errorf("%w: signatures[%d].sig: %w", ErrMalformedEnvelope, i, err)
		}
	}
	return e, payload, nil
}

// decodeB64 accepts only the standard alphabet with padding and zero trailing
// bits (the Go decoder would otherwise skip CR and LF).
func decodeB64(s string) ([]byte, error) {
	if s == "" {
		return nil, errors.New("empty")
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '=') {
			return nil, fmt.Errorf("not standard base64: byte %#02x at offset %d", c, i)
		}
	}
	b, err := b64.DecodeString(s)
	if err != nil {
		return nil, fmt.Errorf("not canonical standard base64: %w", err)
	}
	return b, nil
}

type envParser struct {
	dec *json.Decoder
	err error
}

func (p *envParser) fail(format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%w: %s", ErrMalformedEnvelope, fmt.Sprintf(format, args...))
	}
}

func (p *envParser) token() json.Token {
	if p.err != nil {
		return nil
	}
	t, err := p.dec.Token()
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		p.err = fmt.Errorf("%w: %w", ErrMalformedEnvelope, err)
		return nil
	}
	return t
}

func (p *envParser) delim(want json.Delim) {
	if t := p.token(); p.err == nil {
		if d, ok := t.(json.Delim); !ok || d != want {
			p.fail("expected %q", string(want))
		}
	}
}

func (p *envParser) str(field string) string {
	t := p.token()
	if p.err != nil {
		return ""
	}
	s, ok := t.(string)
	if !ok || s == "" {
		p.fail("%s must be a non-empty string", field)
	}
	return s
}

// object reads the members of an object whose '{' was consumed, calling
// member for each allowed name once; unknown and repeated names fail.
func (p *envParser) object(at string, names []string, member func(name string)) {
	seen := make(map[string]bool, len(names))
	for p.err == nil && p.dec.More() {
		t := p.token()
		if p.err != nil {
			return
		}
		name, _ := t.(string)
		allowed := false
		for _, n := range names {
			allowed = allowed || n == name
		}
		switch {
		case !allowed:
			p.fail("unknown field %q in %s", name, at)
		case seen[name]:
			p.fail("duplicate field %q in %s", name, at)
		default:
			seen[name] = true
			member(name)
		}
	}
	p.delim('}')
	for _, n := range names {
		if p.err == nil && !seen[n] {
			p.fail("missing field %q in %s", n, at)
		}
	}
}

func (p *envParser) envelope() *ssldsse.Envelope {
	var e ssldsse.Envelope
	p.delim('{')
	if p.err != nil {
		return nil
	}
	p.object("envelope", []string{"payloadType", "payload", "signatures"}, func(name string) {
		switch name {
		case "payloadType":
			e.PayloadType = p.str(name)
		case "payload":
			e.Payload = p.str(name)
		case "signatures":
			e.Signatures = p.signatures()
		}
	})
	return &e
}

func (p *envParser) signatures() []ssldsse.Signature {
	p.delim('[')
	var sigs []ssldsse.Signature
	for p.err == nil && p.dec.More() {
		if len(sigs) == MaxSignatures {
			p.fail("more than %d signatures", MaxSignatures)
			return nil
		}
		at := fmt.Sprintf("signatures[%d]", len(sigs))
		var s ssldsse.Signature
		p.delim('{')
		if p.err != nil {
			return nil
		}
		p.object(at, []string{"keyid", "sig"}, func(name string) {
			switch name {
			case "keyid":
				s.KeyID = p.str(at + ".keyid")
			case "sig":
				s.Sig = p.str(at + ".sig")
			}
		})
		sigs = append(sigs, s)
	}
	p.delim(']')
	if p.err == nil && len(sigs) == 0 {
		p.fail("no signatures")
	}
	return sigs
}

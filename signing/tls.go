package signing

import "crypto/tls"

// TLSCipherSuites are the only TLS 1.2 suites Drover's servers and clients
// offer: ECDHE key exchange with an AEAD cipher (AES-GCM or
// ChaCha20-Poly1305). The CBC suites with SHA-1 MACs that Go still lists by
// default for TLS 1.2 (ECDHE-ECDSA-AES128-SHA, ...) are left out. TLS 1.3
// suites are not configurable and all AEAD.
func TLSCipherSuites() []uint16 {
	return []uint16{
		tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
		tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
		tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
	}
}

package agent

import (
	"math/rand/v2"
	"time"
)

// backoff is exponential backoff with jitter: each delay is drawn from
// [d/2, d] where d doubles from base up to max.
type backoff struct {
	base, max, cur time.Duration
}

func newBackoff(base, max time.Duration) *backoff {
	if max < base {
		max = base
	}
	return &backoff{base: base, max: max}
}

// next returns the delay before the next attempt.
func (b *backoff) next() time.Duration {
	switch {
	case b.cur == 0:
		b.cur = b.base
	case b.cur < b.max:
		b.cur *= 2
		if b.cur > b.max {
			b.cur = b.max
		}
	}
	half := b.cur / 2
	return half + rand.N(half+1)
}

// reset starts over at base after a success.
func (b *backoff) reset() { b.cur = 0 }

// jitterFactor returns a factor in [1-frac, 1+frac]: a wait of d moved
// randomly by up to frac of itself is scaled(d, f), and scaled again with
// the same f when its base changes.
func jitterFactor(frac float64) float64 { return 1 - frac + 2*frac*rand.Float64() }

// scaled returns d times f.
func scaled(d time.Duration, f float64) time.Duration { return time.Duration(float64(d) * f) }

// tokenAttempts paces enrollment attempts (first enrollment and
// re-enrollment alike): a token is tried at once, a failed one again after
// backoff, and a token file whose content changed at once.
type tokenAttempts struct {
	bo       *backoff
	retryAt  time.Time // zero: try as soon as a token is there
	lastFile string    // token file content of the last failed attempt
}

func newTokenAttempts(max time.Duration) *tokenAttempts {
	return &tokenAttempts{bo: newBackoff(time.Second, max)}
}

// due reports whether tok (fromFile: read from the token file) may be
// tried now.
func (t *tokenAttempts) due(tok string, fromFile bool, now time.Time) bool {
	if fromFile && tok != t.lastFile {
		t.retryAt = time.Time{}
	}
	return tok != "" && !now.Before(t.retryAt)
}

// failed records a failed attempt with tok and returns the wait before the
// next one.
func (t *tokenAttempts) failed(tok string, fromFile bool, now time.Time) time.Duration {
	if fromFile {
		t.lastFile = tok
	}
	d := t.bo.next()
	t.retryAt = now.Add(d)
	return d
}

// succeeded starts over.
func (t *tokenAttempts) succeeded() { *t = tokenAttempts{bo: t.bo}; t.bo.reset() }

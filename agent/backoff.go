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

// jitter returns d moved randomly by up to frac of itself in either direction.
func jitter(d time.Duration, frac float64) time.Duration {
	span := time.Duration(float64(d) * frac)
	if span <= 0 {
		return d
	}
	return d - span + rand.N(2*span+1)
}

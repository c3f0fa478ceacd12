package server

import (
	"sync"
	"time"
)

// guards are the per-caller limits of the API that are not a pool or a
// body budget (http_routes.go): certificate renewals per agent and live-log
// followers per API token.
type guards struct {
	renew     *rateLimiter
	followers *keyedLimit // live-log streams per token id
}

func newGuards(cfg Config) *guards {
	return &guards{
		renew:     newRateLimiterEvery(cfg.Enrollment.RenewInterval, cfg.Enrollment.RenewBurst),
		followers: newKeyedLimit(cfg.LiveLogs.MaxPerToken),
	}
}

// follow takes a live-log slot for a token; release gives it back. It
// reports false when the token already holds its share.
func (g *guards) follow(token string) (release func(), ok bool) { return g.followers.take(token) }

// keyedLimit bounds what each key holds at once.
type keyedLimit struct {
	mu   sync.Mutex
	max  int
	held map[string]int
}

func newKeyedLimit(n int) *keyedLimit { return &keyedLimit{max: max(n, 1), held: map[string]int{}} }

// take holds one for key; release gives it back. False when key holds max.
func (k *keyedLimit) take(key string) (release func(), ok bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.held[key] >= k.max {
		return nil, false
	}
	k.held[key]++
	return func() {
		k.mu.Lock()
		defer k.mu.Unlock()
		if k.held[key]--; k.held[key] <= 0 {
			delete(k.held, key)
		}
	}, true
}

// newRateLimiterEvery is a per-key bucket of burst tokens that refills one
// token every interval.
func newRateLimiterEvery(interval time.Duration, burst int) *rateLimiter {
	return &rateLimiter{rate: 1 / interval.Seconds(), burst: float64(burst), buckets: map[string]*bucket{}}
}

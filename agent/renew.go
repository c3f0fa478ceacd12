package agent

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/pemutil"
	"github.com/drover/drover/internal/tick"
)

// renewLoop renews the client certificate at two thirds of its lifetime,
// with a fresh key, and retries with backoff.
func (a *Agent) renewLoop(ctx context.Context) {
	bo := newBackoff(5*time.Second, a.cfg.MaxBackoff)
	for {
		id := a.identity()
		wait := time.Until(id.RenewAt())
		if wait > 0 {
			// Wake at least hourly so that a stepped clock is noticed.
			if !tick.Sleep(ctx, min(wait, time.Hour)) {
				return
			}
			continue
		}
		if err := a.renew(ctx); err != nil {
			if ctx.Err() != nil {
				return
			}
			d := bo.next()
			a.log.Error("certificate renewal failed; retrying", "err", err, "retry_in", d.Round(time.Millisecond),
				"expires", id.NotAfter())
			if !tick.Sleep(ctx, d) {
				return
			}
			continue
		}
		bo.reset()
	}
}

// renew obtains a new certificate for a new key over mTLS and installs it.
func (a *Agent) renew(ctx context.Context) error {
	id := a.identity()
	key, csr, err := pemutil.NewKeyAndCSR(a.host.Hostname)
	if err != nil {
		return err
	}
	var out api.RenewResponse
	resp, err := a.httpClient().R().SetContext(ctx).SetBody(api.RenewRequest{CSR: csr}).SetResult(&out).Post(pathRenew)
	err = checkResponse(resp, err)
	a.noteAuth(err)
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	caPEM := []byte(out.CABundle)
	if len(caPEM) == 0 {
		caPEM = id.caPEM
	}
	leaf, err := checkIssued([]byte(out.Certificate), caPEM, key, time.Now())
	if err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if leaf.NotAfter.Before(id.NotAfter()) {
		return errors.New("renew: the new certificate expires before the old one")
	}
	cred, err := encodeCredentials([]byte(out.Certificate), key)
	if err != nil {
		return err
	}
	cur := a.identity() // the replica lists may have changed meanwhile
	next := &Identity{AgentID: id.AgentID, Server: id.Server, GRPCAddr: cur.GRPCAddr, EnrolledAt: id.EnrolledAt,
		ServerURLs: cur.ServerURLs, GRPCAddrs: cur.GRPCAddrs}
	if err := next.setCredentials(cred, caPEM); err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if err := saveCredentials(a.cfg.DataDir, cred, caPEM); err != nil {
		return fmt.Errorf("renew: save: %w", err)
	}
	if urls, addrs, err := checkReplicaLists(out.ServerURLs, out.GRPCAddrs); err != nil {
		a.log.Warn("ignoring the replica list the server sent", "err", err)
	} else if len(urls) > 0 && (!slices.Equal(urls, next.ServerURLs) || len(addrs) > 0 && !slices.Equal(addrs, next.GRPCAddrs)) {
		next.ServerURLs = urls
		if len(addrs) > 0 {
			next.GRPCAddrs, next.GRPCAddr = addrs, addrs[0]
		}
		if err := saveIdentity(a.cfg.DataDir, next); err != nil {
			a.log.Error("save the server's replica list", "err", err)
		}
	}
	a.setIdentity(next)
	a.log.Info("certificate renewed", "expires", next.NotAfter(), "renew_at", next.RenewAt())
	return nil
}

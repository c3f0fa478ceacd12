package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/internal/pemutil"
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
			if !sleep(ctx, min(wait, time.Hour)) {
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
			if !sleep(ctx, d) {
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
	next := &Identity{AgentID: id.AgentID, Server: id.Server, GRPCAddr: id.GRPCAddr, EnrolledAt: id.EnrolledAt}
	if err := next.setCredentials(cred, caPEM); err != nil {
		return fmt.Errorf("renew: %w", err)
	}
	if err := saveCredentials(a.cfg.DataDir, cred, caPEM); err != nil {
		return fmt.Errorf("renew: save: %w", err)
	}
	a.setIdentity(next)
	a.log.Info("certificate renewed", "expires", next.NotAfter(), "renew_at", next.RenewAt())
	return nil
}

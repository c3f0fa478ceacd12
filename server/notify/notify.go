// Package notify sends the server's fleet events to notification channels
// (docs/monitoring.md, "Notifications"): webhooks (JSON signed with
// HMAC-SHA256 in X-Drover-Signature) and Prometheus Alertmanager (its v2
// API, resolved on recovery). Rules pick the events of each channel; one
// notification goes out per change of state, not per run. Routing writes
// each notification into the store's delivery queue, and the Deliverer
// sends the queue with retries and backoff, so deliveries survive a
// restart. Only the server imports it.
package notify

import (
	"fmt"
	"net/url"
	"regexp"
	"slices"
	"strings"

	"github.com/drover/drover/api"
)

// Event kinds a rule may name (docs/monitoring.md, "Events").
var Kinds = []string{"run.failed", "run.missed", "run.long", "run.recovered", "agent.offline", "agent.online",
	"manifest.rejected", "manifest.expired", "identity.conflict", "pipe.moved"}

// Bounds of the configuration.
const (
	MaxChannels       = 100
	MaxRules          = 200
	MaxURLBytes       = 2048
	MaxSecretBytes    = 4096
	maxRuleChannels   = 20
	maxRulePipes      = 100
	maxRuleTags       = 20
	maxTagBytes       = 256
	minSecretBytes    = 16
	defaultSeverity   = "warning"
	signatureHeader   = "X-Drover-Signature"
	alertsPath        = "/api/v2/alerts"
	webhookMediaType  = "application/json"
	maxResponseDrains = 64 << 10
)

// SignatureHeader is the header carrying a webhook body's signature.
const SignatureHeader = signatureHeader

var (
	nameRE     = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
	severityRE = regexp.MustCompile(`^[a-z]{1,16}$`)
)

// ValidName reports whether s is a valid channel or rule name (DNS label).
func ValidName(s string) bool { return nameRE.MatchString(s) }

func detail(field, format string, args ...any) api.Detail {
	return api.Detail{Field: field, Message: fmt.Sprintf(format, args...)}
}

// ValidateChannel checks a channel; hasSecret tells whether a secret is
// stored already (a webhook needs one).
func ValidateChannel(c *api.NotifyChannel, hasSecret bool) []api.Detail {
	var ds []api.Detail
	if !ValidName(c.Name) {
		ds = append(ds, detail("name", "must be a DNS label: lower-case letters, digits and '-', at most 63"))
	}
	switch c.Kind {
	case api.ChannelWebhook, api.ChannelAlertmanager:
	case "":
		ds = append(ds, detail("kind", "required: webhook or alertmanager"))
	default:
		ds = append(ds, detail("kind", "unknown kind %q: webhook or alertmanager", c.Kind))
	}
	if msg := checkURL(c.URL); msg != "" {
		ds = append(ds, detail("url", "%s", msg))
	}
	if c.Secret != nil {
		switch n := len(*c.Secret); {
		case c.Kind == api.ChannelAlertmanager:
			ds = append(ds, detail("secret", "an alertmanager channel takes no secret"))
		case n < minSecretBytes:
			ds = append(ds, detail("secret", "at least %d bytes", minSecretBytes))
		case n > MaxSecretBytes:
			ds = append(ds, detail("secret", "at most %d bytes", MaxSecretBytes))
		}
	} else if c.Kind == api.ChannelWebhook && !hasSecret {
		ds = append(ds, detail("secret", "required for a webhook (it signs the body)"))
	}
	return ds
}

func checkURL(s string) string {
	if s == "" {
		return "required"
	}
	if len(s) > MaxURLBytes {
		return fmt.Sprintf("at most %d bytes", MaxURLBytes)
	}
	u, err := url.Parse(s)
	if err != nil {
		return "not a URL"
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return "must be http or https"
	}
	if u.Host == "" {
		return "has no host"
	}
	if u.User != nil {
		return "must not carry credentials"
	}
	return ""
}

// ValidateRule checks a rule against the channels that exist.
func ValidateRule(r *api.NotifyRule, channels map[string]bool) []api.Detail {
	var ds []api.Detail
	if !ValidName(r.Name) {
		ds = append(ds, detail("name", "must be a DNS label: lower-case letters, digits and '-', at most 63"))
	}
	if len(r.Kinds) == 0 {
		ds = append(ds, detail("kinds", "required: at least one event kind"))
	}
	for i, k := range r.Kinds {
		if !slices.Contains(Kinds, k) {
			ds = append(ds, detail(fmt.Sprintf("kinds[%d]", i), "unknown event kind %q (one of %s)", k, strings.Join(Kinds, ", ")))
		}
	}
	if len(r.Channels) == 0 {
		ds = append(ds, detail("channels", "required: at least one channel"))
	}
	if len(r.Channels) > maxRuleChannels {
		ds = append(ds, detail("channels", "at most %d", maxRuleChannels))
	}
	for i, c := range r.Channels {
		if !channels[c] {
			ds = append(ds, detail(fmt.Sprintf("channels[%d]", i), "no channel %q", c))
		}
	}
	if len(r.Pipes) > maxRulePipes {
		ds = append(ds, detail("pipes", "at most %d", maxRulePipes))
	}
	for i, p := range r.Pipes {
		if p == "" || len(p) > 253 {
			ds = append(ds, detail(fmt.Sprintf("pipes[%d]", i), "not a pipe name"))
		}
	}
	if len(r.Tags) > maxRuleTags {
		ds = append(ds, detail("tags", "at most %d", maxRuleTags))
	}
	for k, v := range r.Tags {
		if k == "" || len(k) > maxTagBytes || len(v) > maxTagBytes {
			ds = append(ds, detail("tags."+k, "keys of 1-%d bytes, values of at most %d", maxTagBytes, maxTagBytes))
		}
	}
	if r.Severity != "" && !severityRE.MatchString(r.Severity) {
		ds = append(ds, detail("severity", "lower-case letters, at most 16 (e.g. warning, critical)"))
	}
	return ds
}

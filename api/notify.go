package api

import "time"

// Notification channel kinds (docs/monitoring.md, "Notifications").
const (
	ChannelWebhook      = "webhook"
	ChannelAlertmanager = "alertmanager"
)

// NotifyChannel is a notification channel. Secret is write-only: it is
// accepted on PUT and never returned (HasSecret tells whether one is set).
type NotifyChannel struct {
	Name string `json:"name"`
	// Kind is webhook or alertmanager.
	Kind string `json:"kind"`
	// URL is the webhook's URL, or the Alertmanager's base URL (the
	// server posts to URL/api/v2/alerts).
	URL string `json:"url"`
	// Secret signs webhook bodies (X-Drover-Signature); write-only.
	Secret    *string   `json:"secret,omitempty"`
	HasSecret bool      `json:"has_secret,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// NotifyChannelList lists channels by name.
type NotifyChannelList struct {
	Channels []NotifyChannel `json:"channels"`
}

// NotifyRule sends the events of some kinds, optionally only of some pipes
// or of agents with some tags, to channels.
type NotifyRule struct {
	Name string `json:"name"`
	// Kinds are event kinds (run.failed, run.missed, ...); a rule with
	// run.failed or run.missed also sends run.recovered, one with
	// agent.offline also sends agent.online.
	Kinds []string `json:"kinds"`
	// Pipes, when set, limits the rule to events of these pipes.
	Pipes []string `json:"pipes,omitempty"`
	// Tags, when set, limits the rule to events of agents with all of them.
	Tags     map[string]string `json:"tags,omitempty"`
	Channels []string          `json:"channels"`
	// Severity is the alert's severity label (default warning).
	Severity  string    `json:"severity,omitempty"`
	CreatedAt time.Time `json:"created_at,omitzero"`
	UpdatedAt time.Time `json:"updated_at,omitzero"`
}

// NotifyRuleList lists rules by name.
type NotifyRuleList struct {
	Rules []NotifyRule `json:"rules"`
}

// ChannelStatus is a channel's delivery status.
type ChannelStatus struct {
	Channel         string    `json:"channel"`
	Pending         int       `json:"pending"`
	Delivered       int       `json:"delivered"`
	Failed          int       `json:"failed"` // given up
	LastError       string    `json:"last_error,omitempty"`
	LastAttemptAt   time.Time `json:"last_attempt_at,omitzero"`
	LastDeliveredAt time.Time `json:"last_delivered_at,omitzero"`
}

// ChannelStatusList is the delivery status of every channel.
type ChannelStatusList struct {
	Channels []ChannelStatus `json:"channels"`
}

// NotifyTestResponse answers a channel test: the test notification was
// sent synchronously (Error is empty on success).
type NotifyTestResponse struct {
	Channel string `json:"channel"`
	OK      bool   `json:"ok"`
	Error   string `json:"error,omitempty"`
}

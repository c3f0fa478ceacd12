package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/drover/drover/internal/command"
	"github.com/spf13/cobra"
	"go.yaml.in/yaml/v3"

	"github.com/drover/drover/api"
)

// Notification channels and rules (docs/monitoring.md, "Notifications"):
// `get channels`, `get rules`, and the notify command (apply, test, status,
// delete). Declarative files hold documents of kind Channel and NotifyRule,
// so they live in git beside the pipes; a channel's secret comes from the
// environment variable secret_env names, never from the file.

func (a *app) newNotifyCmd() *cobra.Command {
	var files []string
	apply := &cobra.Command{
		Use:   "apply -f FILE...",
		Short: "Create or replace the channels and rules of YAML files (kind: Channel, kind: NotifyRule)",
		Long: `Apply notification channels and rules. Each YAML document is one object:

  kind: Channel
  name: ops-hook
  type: webhook                 # or alertmanager
  url: https://hooks.example/drover
  secret_env: OPS_HOOK_SECRET   # the signing secret is read from this variable
  ---
  kind: NotifyRule
  name: backups
  kinds: [run.failed, run.missed]
  pipes: [backup-db]
  tags: {env: prod}
  channels: [ops-hook]
  severity: critical

Channels are applied before rules. A channel without secret_env keeps the
secret stored on the server.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if len(files) == 0 {
				return command.Usagef("notify apply wants -f FILE")
			}
			return a.notifyApply(cmd.Context(), files)
		},
	}
	apply.Flags().StringArrayVarP(&files, "filename", "f", nil, "YAML file (repeatable; - for stdin)")
	test := &cobra.Command{
		Use: "test CHANNEL", Short: "Send a test notification to a channel now", Args: exactArgs(1, "CHANNEL"),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			var r api.NotifyTestResponse
			raw, err := c.call(cmd.Context(), "POST", "/api/v1/notify/channels/"+pathEscape(args[0])+"/test", nil, &r)
			if err != nil {
				return err
			}
			if a.format() != "table" {
				return a.printData(raw)
			}
			if !r.OK {
				return fmt.Errorf("channel %s: %s", r.Channel, r.Error)
			}
			fmt.Fprintf(a.stdout(), "channel %s: test notification delivered\n", r.Channel)
			return nil
		},
	}
	status := &cobra.Command{
		Use: "status", Short: "Delivery status per channel: queued, delivered, given up, the last error", Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			var st api.ChannelStatusList
			raw, err := c.get(cmd.Context(), "/api/v1/notify/status", &st)
			if err != nil {
				return err
			}
			if a.format() != "table" {
				return a.printData(raw)
			}
			t := newTable(a.stdout(), "CHANNEL", "PENDING", "DELIVERED", "FAILED", "LAST DELIVERED", "LAST ERROR")
			for _, s := range st.Channels {
				t.row(s.Channel, itoa(s.Pending), itoa(s.Delivered), itoa(s.Failed), fmtTimeV(s.LastDeliveredAt), s.LastError)
			}
			return t.flush()
		},
	}
	del := &cobra.Command{
		Use: "delete channel|rule NAME", Short: "Delete a channel (no rule may use it) or a rule", Args: exactArgs(2, "channel|rule NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			var path string
			switch args[0] {
			case "channel", "channels":
				path = "/api/v1/notify/channels/"
			case "rule", "rules":
				path = "/api/v1/notify/rules/"
			default:
				return command.Usagef("notify delete %q: use channel or rule", args[0])
			}
			c, err := a.apiClient()
			if err != nil {
				return err
			}
			if _, err := c.call(cmd.Context(), "DELETE", path+pathEscape(args[1]), nil, nil); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout(), "%s %s deleted\n", strings.TrimSuffix(args[0], "s"), args[1])
			return nil
		},
	}
	return groupCmd("notify", "Notification channels and rules: apply, test, status, delete", apply, test, status, del)
}

// notifyDoc is one document of a notification file.
type notifyDoc struct {
	Kind      string            `yaml:"kind"`
	Name      string            `yaml:"name"`
	Type      string            `yaml:"type"`
	URL       string            `yaml:"url"`
	SecretEnv string            `yaml:"secret_env"`
	Kinds     []string          `yaml:"kinds"`
	Pipes     []string          `yaml:"pipes"`
	Tags      map[string]string `yaml:"tags"`
	Channels  []string          `yaml:"channels"`
	Severity  string            `yaml:"severity"`
}

// readNotifyDocs reads every document of files, channels first.
func (a *app) readNotifyDocs(files []string) ([]notifyDoc, error) {
	var chans, rules []notifyDoc
	for _, f := range files {
		var data []byte
		var err error
		if f == "-" {
			data, err = io.ReadAll(io.LimitReader(a.env.Stdin, 1<<20))
		} else {
			data, err = os.ReadFile(f)
		}
		if err != nil {
			return nil, err
		}
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		for i := 1; ; i++ {
			var d notifyDoc
			if err := dec.Decode(&d); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				return nil, fmt.Errorf("%s: document %d: %w", f, i, err)
			}
			switch d.Kind {
			case "Channel":
				if d.Type == "" {
					return nil, fmt.Errorf("%s: document %d (channel %s): type is required (webhook or alertmanager)", f, i, d.Name)
				}
				chans = append(chans, d)
			case "NotifyRule":
				rules = append(rules, d)
			case "":
				if d.Name != "" {
					return nil, fmt.Errorf("%s: document %d: kind is required (Channel or NotifyRule)", f, i)
				}
			default:
				return nil, fmt.Errorf("%s: document %d: unknown kind %q (Channel or NotifyRule)", f, i, d.Kind)
			}
		}
	}
	return append(chans, rules...), nil
}

func (a *app) notifyApply(ctx context.Context, files []string) error {
	docs, err := a.readNotifyDocs(files)
	if err != nil {
		return err
	}
	c, err := a.apiClient()
	if err != nil {
		return err
	}
	for _, d := range docs {
		if d.Kind == "Channel" {
			ch := api.NotifyChannel{Name: d.Name, Kind: d.Type, URL: d.URL}
			if d.SecretEnv != "" {
				v := a.env.Getenv(d.SecretEnv)
				if v == "" {
					return fmt.Errorf("channel %s: $%s is empty or not set", d.Name, d.SecretEnv)
				}
				ch.Secret = &v
			}
			if _, err := c.call(ctx, "PUT", "/api/v1/notify/channels/"+pathEscape(d.Name), ch, nil); err != nil {
				return fmt.Errorf("channel %s: %w", d.Name, err)
			}
			fmt.Fprintf(a.stdout(), "channel %s applied\n", d.Name)
			continue
		}
		r := api.NotifyRule{Name: d.Name, Kinds: d.Kinds, Pipes: d.Pipes, Tags: d.Tags, Channels: d.Channels, Severity: d.Severity}
		if _, err := c.call(ctx, "PUT", "/api/v1/notify/rules/"+pathEscape(d.Name), r, nil); err != nil {
			return fmt.Errorf("rule %s: %w", d.Name, err)
		}
		fmt.Fprintf(a.stdout(), "rule %s applied\n", d.Name)
	}
	return nil
}

// getNotify is `get channels` and `get rules`.
func (a *app) getNotify(ctx context.Context, c *client, kind string, names []string) error {
	path, key, table := "/api/v1/notify/channels", "channels", a.channelsTable
	if kind == "rules" {
		path, key, table = "/api/v1/notify/rules", "rules", a.rulesTable
	}
	if len(names) == 0 {
		var page map[string]json.RawMessage
		if _, err := c.get(ctx, path, &page); err != nil {
			return err
		}
		var items []json.RawMessage
		if err := json.Unmarshal(page[key], &items); err != nil {
			return fmt.Errorf("unexpected answer from the server: %w", err)
		}
		return a.printList(key, items, table)
	}
	items, err := fetchNamed(ctx, c, path+"/", strings.TrimSuffix(key, "s"), names)
	if err != nil {
		return err
	}
	if len(items) == 1 {
		return a.printOne(key, items[0], table)
	}
	return a.printList(key, items, table)
}

func (a *app) channelsTable(items []json.RawMessage) error {
	chs, err := decodeAll[api.NotifyChannel](items)
	if err != nil {
		return err
	}
	t := newTable(a.stdout(), "NAME", "TYPE", "URL", "SECRET", "UPDATED")
	for _, c := range chs {
		sec := "-"
		if c.HasSecret {
			sec = "set"
		}
		t.row(c.Name, c.Kind, c.URL, sec, fmtTimeV(c.UpdatedAt))
	}
	return t.flush()
}

func (a *app) rulesTable(items []json.RawMessage) error {
	rs, err := decodeAll[api.NotifyRule](items)
	if err != nil {
		return err
	}
	t := newTable(a.stdout(), "NAME", "KINDS", "PIPES", "TAGS", "CHANNELS", "SEVERITY")
	for _, r := range rs {
		pipes := strings.Join(r.Pipes, ",")
		if pipes == "" {
			pipes = "*"
		}
		sev := r.Severity
		if sev == "" {
			sev = "warning"
		}
		t.row(r.Name, strings.Join(r.Kinds, ","), pipes, fmtTags(r.Tags), strings.Join(r.Channels, ","), sev)
	}
	return t.flush()
}

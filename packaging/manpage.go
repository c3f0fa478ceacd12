package packaging

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"github.com/drover/drover/internal/paths"
	"os"
	"os/exec"
	"strings"
	"time"
)

// Man pages are generated at build time from the binaries' own --help
// (recursively through the subcommands cobra lists under "Available
// Commands:"), framed by the sections below, so they never drift from the
// code.

// ManPage describes one binary's page.
type ManPage struct {
	Binary      string // drover-agent
	Section     int    // 8 for daemons, 1 for the CLI
	Summary     string // the NAME line after the dash
	Description string // paragraphs, separated by blank lines
	Files       [][2]string
	Environment [][2]string
	SeeAlso     []string
}

// ManPages are the pages of the three binaries.
var ManPages = []ManPage{
	{
		Binary: "drover-agent", Section: 8,
		Summary: "Drover agent: runs this host's pipes as systemd timers",
		Description: `drover-agent pulls the signed manifest of this host from a Drover control plane, verifies its signature, serial and expiry and every payload's digest, and renders each pipe as a drover-pipe-NAME.timer and drover-pipe-NAME.service pair in /etc/systemd/system (falling back to an internal cron scheduler where systemd is absent). Runs, their status and logs go back to the server over one mTLS gRPC stream and are reported exactly once, also after outages.

Without a command it runs the daemon, normally as the systemd service drover-agent.service. Pipe services run "drover-agent run NAME". Enrollment needs no human: write the server URL to /etc/drover/agent.yaml and a one-time token to /etc/drover/enroll.token; the agent enrolls and deletes the token.

Inspect the pipes with systemctl list-timers 'drover-pipe-*', systemctl status drover-pipe-NAME.service and journalctl -u drover-pipe-NAME; the agent's own state with drover-agent status.`,
		Files: [][2]string{
			{paths.AgentConfigFile, "configuration; every setting is listed there, commented out, with its default"},
			{paths.EnrollTokenFile, "one-time enrollment token dropped by config management (mode 0600); removed after enrolling"},
			{paths.AgentDataDir, "key, certificates, database and payloads (mode 0700)"},
			{"/etc/systemd/system/drover-pipe-*.timer, drover-pipe-*.service", "the pipes' units; only files whose first line is \"# Managed by drover-agent. Local changes are overwritten.\" are ever changed or removed"},
		},
		Environment: [][2]string{
			{"DROVER_SERVER, DROVER_DATA_DIR, DROVER_TOKEN_FILE, DROVER_BACKEND, DROVER_SCOPE, DROVER_SYNC_INTERVAL, DROVER_LOG_LEVEL, ...", "override the setting of the same name in agent.yaml; flags override both"},
			{"DROVER_ENROLL_TOKEN", "an enrollment token given directly instead of the token file"},
		},
		SeeAlso: []string{"drover-server(8)", "droverctl(1)", "systemctl(1)", "systemd.timer(5)", "journalctl(1)"},
	},
	{
		Binary: "drover-server", Section: 8,
		Summary: "Drover control plane",
		Description: `drover-server holds the pipe definitions of a fleet, enrolls agents with one-time tokens and its own certificate authority, compiles and signs one manifest per agent, serves it over HTTPS (port 8443) and collects runs, status and logs on a gRPC stream (port 8444). Its state lives in an embedded SQLite database.

Normally it runs as the systemd service drover-server.service, as the system user drover. The first start creates the CA, the keys, admin.token (the bootstrap administrator API token, mode 0600) and ca.crt (the CA certificate, PEM) in the data directory.`,
		Files: [][2]string{
			{paths.ServerConfigFile, "configuration; every setting is listed there, commented out, with its default"},
			{paths.ServerDataDir, "CA, keys, database, admin.token and ca.crt (mode 0700, owner drover)"},
		},
		Environment: [][2]string{
			{"DROVER_<PATH>", "overrides the setting at PATH in server.yaml, upper-cased and joined by '_': DROVER_HTTP_ADDR, DROVER_DATA_DIR, DROVER_ENROLLMENT_CERT_LIFETIME; flags override both"},
		},
		SeeAlso: []string{"drover-agent(8)", "droverctl(1)"},
	},
	{
		Binary: "droverctl", Section: 1,
		Summary: "operate a Drover control plane",
		Description: `droverctl is the operator's command line for a Drover control plane: pipes, agents, runs, enrollment tokens, secrets and schedules.

Shell completion for bash, zsh and fish is installed with the package; "droverctl completion SHELL" prints it.`,
		Environment: [][2]string{
			{"DROVER_SERVER, DROVER_TOKEN, DROVER_CA", "the server URL, API token and CA certificate file to use when no flag gives them"},
		},
		SeeAlso: []string{"drover-server(8)", "drover-agent(8)"},
	},
}

// helpNode is one command's --help output.
type helpNode struct {
	path []string
	text string
}

// collectHelp runs bin --help and recurses into listed subcommands (not
// into "help" and "completion", whose subcommands are the same for every
// cobra program), depth-first in the listed order.
func collectHelp(ctx context.Context, bin string, path []string, depth int) ([]helpNode, error) {
	args := append(append([]string{}, path...), "--help")
	cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(cctx, bin, args...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=/nonexistent", "LANG=C", "TERM=dumb"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %v: %s", bin, strings.Join(args, " "), err, out)
	}
	text := strings.TrimRight(string(out), "\n")
	nodes := []helpNode{{path: path, text: text}}
	if depth >= 3 {
		return nodes, nil
	}
	for _, sub := range subcommands(text) {
		if sub == "help" {
			continue
		}
		d := depth + 1
		if sub == "completion" {
			d = 3 // its own help only: its subcommands are cobra's, the same everywhere
		}
		more, err := collectHelp(ctx, bin, append(append([]string{}, path...), sub), d)
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, more...)
	}
	return nodes, nil
}

// subcommands parses cobra's "Available Commands:" block (also "Additional
// Commands:" and grouped command headings ending in "Commands:").
func subcommands(help string) []string {
	var out []string
	in := false
	sc := bufio.NewScanner(strings.NewReader(help))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasSuffix(strings.TrimSpace(line), "Commands:") && !strings.HasPrefix(line, " "):
			in = true
		case in && strings.HasPrefix(line, "  ") && strings.TrimSpace(line) != "":
			f := strings.Fields(line)
			out = append(out, f[0])
		case in:
			in = false
		}
	}
	return out
}

// roffEscape makes text safe inside a .nf block or a paragraph.
func roffEscape(s string) string {
	s = strings.ReplaceAll(s, `\`, `\e`)
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if strings.HasPrefix(line, ".") || strings.HasPrefix(line, "'") {
			b.WriteString(`\&`)
		}
		b.WriteString(strings.ReplaceAll(line, "-", `\-`))
		b.WriteByte('\n')
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// RenderMan returns the page in roff.
func RenderMan(p ManPage, nodes []helpNode, version string, date time.Time) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, ".\\\" Generated by packaging/cmd/mkpkg from %s --help; do not edit.\n", p.Binary)
	fmt.Fprintf(&b, ".TH %s %d %q %q %q\n", strings.ToUpper(p.Binary), p.Section, date.Format("2006-01-02"), p.Binary+" "+version, "Drover")
	fmt.Fprintf(&b, ".SH NAME\n%s \\- %s\n", roffEscape(p.Binary), roffEscape(p.Summary))
	fmt.Fprintf(&b, ".SH SYNOPSIS\n.B %s\n[\\fICOMMAND\\fR] [\\fIFLAGS\\fR]\n", roffEscape(p.Binary))
	b.WriteString(".SH DESCRIPTION\n")
	for i, para := range strings.Split(p.Description, "\n\n") {
		if i > 0 {
			b.WriteString(".PP\n")
		}
		b.WriteString(roffEscape(strings.Join(strings.Fields(para), " ")) + "\n")
	}
	b.WriteString(".SH COMMANDS AND OPTIONS\nThe output of \\fB--help\\fR for the program and each of its commands.\n")
	for _, n := range nodes {
		title := strings.Join(append([]string{p.Binary}, n.path...), " ")
		fmt.Fprintf(&b, ".SS %q\n.nf\n%s\n.fi\n", roffEscape(title), roffEscape(n.text))
	}
	section := func(name string, items [][2]string) {
		if len(items) == 0 {
			return
		}
		fmt.Fprintf(&b, ".SH %s\n", name)
		for _, it := range items {
			fmt.Fprintf(&b, ".TP\n.B %s\n%s\n", roffEscape(it[0]), roffEscape(it[1]))
		}
	}
	section("FILES", p.Files)
	section("ENVIRONMENT", p.Environment)
	if len(p.SeeAlso) > 0 {
		b.WriteString(".SH SEE ALSO\n")
		for i, s := range p.SeeAlso {
			name, sect, _ := strings.Cut(strings.TrimSuffix(s, ")"), "(")
			sep := ","
			if i == len(p.SeeAlso)-1 {
				sep = ""
			}
			fmt.Fprintf(&b, ".BR %s (%s)%s\n", roffEscape(name), sect, sep)
		}
	}
	return b.Bytes()
}

// gzipBytes compresses deterministically (no name, no time), as the man
// page directories expect.
func gzipBytes(data []byte) ([]byte, error) {
	var b bytes.Buffer
	zw, err := gzip.NewWriterLevel(&b, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(data); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// writeManPage generates p from bin into path (gzip-compressed).
func writeManPage(ctx context.Context, p ManPage, bin, path, version string, date time.Time) error {
	nodes, err := collectHelp(ctx, bin, nil, 0)
	if err != nil {
		return fmt.Errorf("man page %s: %w", p.Binary, err)
	}
	z, err := gzipBytes(RenderMan(p, nodes, version, date))
	if err != nil {
		return err
	}
	return os.WriteFile(path, z, 0o644)
}

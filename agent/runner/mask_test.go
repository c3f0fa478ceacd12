package runner

import (
	"math/rand/v2"
	"strings"
	"testing"
)

func maskAll(m *masker, pieces []string) string {
	var out []byte
	for _, p := range pieces {
		out = append(out, m.push([]byte(p))...)
	}
	return string(append(out, m.flush()...))
}

func TestMaskerSplits(t *testing.T) {
	secrets := []string{"hunter2", "abc", "abcdef", "xyzzy-long-secret"}
	cases := []struct {
		pieces []string
		want   string
	}{
		{[]string{"pw=hunter2\n"}, "pw=***\n"},
		{[]string{"pw=hun", "ter2!"}, "pw=***!"},
		{[]string{"h", "u", "n", "t", "e", "r", "2"}, "***"},
		{[]string{"hunte", "r3"}, "hunter3"},
		{[]string{"abcdef"}, "***"},     // the longer value wins
		{[]string{"abcde", "f"}, "***"}, // and is not cut short by a split
		{[]string{"abcde", "X"}, "***deX"},
		{[]string{"abc"}, "***"}, // at the end of the stream
		{[]string{"xyzzy-long"}, "xyzzy-long"},
		{[]string{"hunter2hunter2"}, "******"},
		{[]string{"no secrets here"}, "no secrets here"},
	}
	for _, c := range cases {
		if got := maskAll(newMasker(secrets), c.pieces); got != c.want {
			t.Errorf("%q: got %q, want %q", c.pieces, got, c.want)
		}
	}
	if got := maskAll(newMasker(nil), []string{"a", "b"}); got != "ab" {
		t.Errorf("no secrets: %q", got)
	}
}

func TestMaskerRandomSplits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	secrets := []string{"S3cr3t!", "p@ssw0rd-very-long-value", "Q"}
	for range 500 {
		var in, want strings.Builder
		for range 30 {
			if rng.IntN(3) == 0 {
				s := secrets[rng.IntN(len(secrets))]
				in.WriteString(s)
				want.WriteString(Mask)
			} else {
				w := []string{"hello ", "S3cr", "p@ss", "word ", "\n", "-", "p@ssw0rd-very"}[rng.IntN(7)]
				in.WriteString(w)
				want.WriteString(w)
			}
		}
		s := in.String()
		var pieces []string
		for len(s) > 0 {
			n := 1 + rng.IntN(min(len(s), 9))
			pieces = append(pieces, s[:n])
			s = s[n:]
		}
		got := maskAll(newMasker(secrets), pieces)
		// The text pieces never complete a secret on their own except
		// "p@ssw0rd-very" + "..." which cannot happen (no "-long-value" word).
		if got != want.String() {
			t.Fatalf("pieces %q:\n got %q\nwant %q", pieces, got, want.String())
		}
	}
}

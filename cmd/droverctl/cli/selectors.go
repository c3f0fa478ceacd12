package cli

import (
	"slices"
	"strings"
)

// withSelectors adds the pairs of -l k=v[,k2=v2] to the --tag pairs: a
// selector means what --tag means, and every pair must match. A pair given
// both ways counts once.
func withSelectors(tags, selectors []string) []string {
	out := slices.Clone(tags)
	for _, sel := range selectors {
		for _, pair := range strings.Split(sel, ",") {
			if pair = strings.TrimSpace(pair); pair != "" && !slices.Contains(out, pair) {
				out = append(out, pair)
			}
		}
	}
	return out
}

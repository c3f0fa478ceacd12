package server

import (
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	"github.com/drover/drover/api"
	"github.com/drover/drover/server/errs"
)

// Lists are paginated: ?limit=N (1-1000, default 100) and ?cursor=C, where
// C is the next_cursor of the previous page; a page without next_cursor is
// the last. Cursors are opaque (base64url of the last item's sort key), so
// a page continues after the last item seen even when items are added or
// removed in between.

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

type page struct {
	limit  int
	cursor string // decoded sort key, "" for the first page
}

var errBadCursor = errs.New(errs.ErrInvalidRequest, "invalid cursor", api.Detail{Field: "cursor", Message: "not a next_cursor of this list"})

func parsePage(r *http.Request) (page, error) {
	q := r.URL.Query()
	pg := page{limit: defaultPageSize}
	if l := q.Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > maxPageSize {
			return pg, errs.New(errs.ErrInvalidRequest, "invalid limit", api.Detail{Field: "limit", Message: fmt.Sprintf("must be 1-%d", maxPageSize)})
		}
		pg.limit = n
	}
	if c := q.Get("cursor"); c != "" {
		b, err := base64.RawURLEncoding.DecodeString(c)
		if err != nil || len(b) == 0 {
			return pg, errBadCursor
		}
		pg.cursor = string(b)
	}
	return pg, nil
}

func encodeCursor(key string) string { return base64.RawURLEncoding.EncodeToString([]byte(key)) }

// idCursor is the cursor of a list keyed by a positive row id, newest
// first: 0 on the first page.
func (pg page) idCursor() (int64, error) {
	if pg.cursor == "" {
		return 0, nil
	}
	id, err := strconv.ParseInt(pg.cursor, 10, 64)
	if err != nil || id <= 0 {
		return 0, errBadCursor
	}
	return id, nil
}

// cutPage trims a list read with limit+1 rows from the store to the page,
// and returns the next cursor (the key of the page's last item) when there
// is more.
func cutPage[T any](list []T, pg page, key func(T) string) ([]T, string) {
	if len(list) <= pg.limit {
		return list, ""
	}
	list = list[:pg.limit]
	return list, encodeCursor(key(list[len(list)-1]))
}

// mapList is f of each item, in order: the items of a list answer, empty
// (never null) when there are none.
func mapList[T, U any](items []T, f func(T) U) []U {
	out := make([]U, 0, len(items))
	for _, x := range items {
		out = append(out, f(x))
	}
	return out
}

// pageAndTags is the page and the tag selector (?tag=k=v) of a list
// request.
func pageAndTags(r *http.Request) (page, map[string]string, error) {
	pg, err := parsePage(r)
	if err != nil {
		return pg, nil, err
	}
	sel, err := queryTags(r)
	return pg, sel, err
}

// listPage parses the page of r, loads the whole list and returns the page
// of it in key order, and the next cursor.
func listPage[T any](r *http.Request, load func(context.Context) ([]T, error), key func(T) string) ([]T, string, error) {
	pg, err := parsePage(r)
	if err != nil {
		return nil, "", err
	}
	list, err := load(r.Context())
	if err != nil {
		return nil, "", err
	}
	items, next := paginate(list, key, pg)
	return items, next, nil
}

// paginate sorts items by key (unique keys) and returns the page after the
// cursor, and the next cursor.
func paginate[T any](items []T, key func(T) string, pg page) ([]T, string) {
	sort.SliceStable(items, func(i, j int) bool { return key(items[i]) < key(items[j]) })
	start := 0
	if pg.cursor != "" {
		start = sort.Search(len(items), func(i int) bool { return key(items[i]) > pg.cursor })
	}
	end := min(start+pg.limit, len(items))
	next := ""
	if end < len(items) {
		next = encodeCursor(key(items[end-1]))
	}
	return items[start:end], next
}

// timeKey renders t so that keys sort by time.
func timeKey(t time.Time) string { return fmt.Sprintf("%020d", t.UnixNano()) }

// newestFirstKey renders t so that keys sort newest first.
func newestFirstKey(t time.Time) string { return fmt.Sprintf("%020d", math.MaxInt64-t.UnixNano()) }

// queryTime parses an RFC 3339 query parameter; "" is the zero time.
func queryTime(r *http.Request, name string) (time.Time, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, errs.New(errs.ErrInvalidRequest, "invalid "+name, api.Detail{Field: name, Message: fmt.Sprintf("%q is not an RFC 3339 time (e.g. 2026-01-02T15:04:05Z)", v)})
	}
	return t, nil
}

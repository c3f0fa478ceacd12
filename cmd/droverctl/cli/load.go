package cli

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/drover/drover/manifest"
)

// Limits of one apply, on top of manifest's per-file limits.
const (
	maxApplyFiles = 10000
	maxApplyPipes = 10000
)

// defaultMaxPayload is the server's default payload cap (signing.max_payload_bytes);
// a bundle over the cap is refused before anything is sent.
const defaultMaxPayload = manifest.DefaultMaxBundleBytes

// source is one YAML file (or stdin) holding pipe specs.
type source struct {
	name     string // as shown in messages
	abs      string // absolute path, "" for stdin
	dir      string // base directory of files: paths
	explicit bool   // named by -f, not found in a directory
	data     []byte
	specs    *manifest.SpecFile // once decoded without a problem
}

// localPipe is one pipe from the files, validated and with its payload.
type localPipe struct {
	spec   manifest.Spec // as written
	norm   manifest.Spec // normalized, as the server stores it
	src    *source
	doc    int
	bundle []byte // the bundle to upload; nil for an inline script
	digest string // of the payload the server will store
}

// problem is one thing wrong with the files, printed as FILE:LINE: FIELD: MESSAGE.
type problem struct {
	file  string
	line  int
	field string
	msg   string
}

func (p problem) String() string {
	var b strings.Builder
	b.WriteString(p.file)
	if p.line > 0 {
		b.WriteString(":" + strconv.Itoa(p.line))
	}
	b.WriteString(": ")
	if p.field != "" {
		b.WriteString(p.field + ": ")
	}
	b.WriteString(p.msg)
	return sanitizeLine(b.String())
}

// loader gathers and validates the pipes of -f arguments.
type loader struct {
	stdin    io.Reader
	warn     func(format string, args ...any)
	sources  []*source
	seen     map[string]bool
	problems []problem
}

// loadPipes reads, decodes and validates every pipe named by paths, builds
// their payloads and checks names across files. Every problem is returned;
// when there is one, the pipes must not be applied.
func loadPipes(paths []string, stdin io.Reader, warn func(string, ...any), maxPayload int64) ([]*localPipe, []problem) {
	l := &loader{stdin: stdin, warn: warn, seen: map[string]bool{}}
	for _, p := range paths {
		l.collect(p)
	}
	if len(l.sources) > maxApplyFiles {
		return nil, append(l.problems, problem{file: paths[0], msg: fmt.Sprintf("%d YAML files, at most %d in one apply", len(l.sources), maxApplyFiles)})
	}
	type decoded struct {
		src   *source
		specs []manifest.Spec
		probs []problem
	}
	var all []decoded
	for _, src := range l.sources {
		specs, probs := decodeSource(src)
		all = append(all, decoded{src, specs, probs})
	}
	// YAML files inside a directory that a pipe bundles (files: [conf/])
	// are payload, not pipes.
	var bundled []string
	for _, d := range all {
		for _, s := range d.specs {
			if len(s.Command) == 0 || d.src.abs == "" {
				continue
			}
			for _, f := range s.Files {
				bundled = append(bundled, filepath.Join(d.src.dir, filepath.FromSlash(path.Clean(f))))
			}
		}
	}
	isBundled := func(src *source) bool {
		if src.explicit || src.abs == "" {
			return false
		}
		for _, b := range bundled {
			if src.abs == b || strings.HasPrefix(src.abs, b+string(filepath.Separator)) {
				return true
			}
		}
		return false
	}
	var pipes []*localPipe
	firstSeen := map[string]*localPipe{}
	for _, d := range all {
		if isBundled(d.src) {
			continue
		}
		l.problems = append(l.problems, d.probs...)
		for i := range d.specs {
			lp := &localPipe{spec: d.specs[i], src: d.src, doc: i}
			if prev, dup := firstSeen[lp.spec.Name]; dup {
				l.problems = append(l.problems, lp.problem("name", fmt.Sprintf("%q is also defined at %s:%d", lp.spec.Name, prev.src.name, prev.line(""))))
				continue
			}
			firstSeen[lp.spec.Name] = lp
			pipes = append(pipes, lp)
		}
	}
	if len(pipes) > maxApplyPipes {
		return nil, append(l.problems, problem{file: paths[0], msg: fmt.Sprintf("%d pipes, at most %d in one apply", len(pipes), maxApplyPipes)})
	}
	for _, lp := range pipes {
		l.problems = append(l.problems, lp.preparePayload(maxPayload)...)
	}
	return pipes, l.problems
}

// collect adds the YAML sources one -f argument names.
func (l *loader) collect(arg string) {
	if arg == "-" {
		if l.seen["-"] {
			return
		}
		l.seen["-"] = true
		data, err := io.ReadAll(io.LimitReader(l.stdin, manifest.MaxSpecFileBytes+1))
		if err != nil {
			l.problems = append(l.problems, problem{file: "<stdin>", msg: err.Error()})
			return
		}
		wd, _ := os.Getwd()
		l.sources = append(l.sources, &source{name: "<stdin>", dir: wd, explicit: true, data: data})
		return
	}
	info, err := os.Stat(arg)
	if err != nil {
		l.problems = append(l.problems, problem{file: arg, msg: describeFSError(err)})
		return
	}
	if !info.IsDir() {
		l.addFile(arg, true)
		return
	}
	err = filepath.WalkDir(arg, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			l.problems = append(l.problems, problem{file: p, msg: describeFSError(err)})
			return nil
		}
		if p != arg && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if d.IsDir() {
			return nil
		}
		ext := strings.ToLower(filepath.Ext(p))
		if ext != ".yaml" && ext != ".yml" {
			return nil
		}
		if !d.Type().IsRegular() {
			l.warn("%s: skipped: not a regular file (symbolic links are not followed in directories)", p)
			return nil
		}
		l.addFile(p, false)
		return nil
	})
	if err != nil {
		l.problems = append(l.problems, problem{file: arg, msg: err.Error()})
	}
}

func (l *loader) addFile(p string, explicit bool) {
	abs, err := filepath.Abs(p)
	if err != nil {
		l.problems = append(l.problems, problem{file: p, msg: err.Error()})
		return
	}
	if l.seen[abs] {
		return
	}
	l.seen[abs] = true
	if len(l.sources) >= maxApplyFiles+1 {
		return
	}
	f, err := os.Open(p)
	if err != nil {
		l.problems = append(l.problems, problem{file: p, msg: describeFSError(err)})
		return
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, manifest.MaxSpecFileBytes+1))
	if err != nil {
		l.problems = append(l.problems, problem{file: p, msg: describeFSError(err)})
		return
	}
	l.sources = append(l.sources, &source{name: p, abs: abs, dir: filepath.Dir(abs), explicit: explicit, data: data})
}

func describeFSError(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	return err.Error()
}

// decodeSource decodes and validates one source's documents.
func decodeSource(src *source) ([]manifest.Spec, []problem) {
	if len(bytes.TrimSpace(src.data)) == 0 {
		return nil, []problem{{file: src.name, msg: "no pipe in this file"}}
	}
	f, err := manifest.DecodeSpecFile(src.data)
	if err != nil {
		var ve *manifest.ValidationError
		if !errors.As(err, &ve) {
			return nil, []problem{{file: src.name, msg: err.Error()}}
		}
		out := make([]problem, 0, len(ve.Problems))
		for _, fe := range ve.Problems {
			out = append(out, problem{file: src.name, line: fe.Line, field: stripDocIndex(fe.Field), msg: fe.Message})
		}
		return nil, out
	}
	if len(f.Specs) == 0 {
		return nil, []problem{{file: src.name, msg: "no pipe in this file"}}
	}
	src.specs = f
	return f.Specs, nil
}

// stripDocIndex turns "[2].limits.memory_mb" into "limits.memory_mb": the
// line already says which document.
func stripDocIndex(field string) string {
	if strings.HasPrefix(field, "[") {
		if i := strings.IndexByte(field, ']'); i > 0 {
			return strings.TrimPrefix(field[i+1:], ".")
		}
	}
	return field
}

// line finds the line of a spec field path ("schedule", "files[1]",
// "limits.memory_mb") in the pipe's document; the document's line when the
// field is not there.
func (lp *localPipe) line(field string) int {
	if lp.src.specs == nil {
		return 0
	}
	return lp.src.specs.Line(lp.doc, field)
}

// problem is a problem with one field of this pipe.
func (lp *localPipe) problem(field, msg string) problem {
	return problem{file: lp.src.name, line: lp.line(field), field: field, msg: msg}
}

// preparePayload normalizes the spec and builds the payload the server will
// store: the bundle of files: for a command, the script's bundle otherwise.
func (lp *localPipe) preparePayload(maxPayload int64) []problem {
	lp.norm = *lp.spec.Clone()
	lp.norm.Normalize()
	if lp.spec.Script != "" {
		b, err := manifest.ScriptBundle(lp.spec.Script)
		if err != nil {
			return []problem{lp.problem("script", err.Error())}
		}
		lp.digest = manifest.Digest(b)
		return nil
	}
	files, err := manifest.ReadBundleFiles(lp.src.dir, lp.spec.Files)
	if err != nil {
		return []problem{lp.problem("files", strings.TrimPrefix(describeBundleError(err, lp.src.dir), "files: "))}
	}
	b, err := manifest.BuildBundle(files)
	if err != nil {
		return []problem{lp.problem("files", err.Error())}
	}
	if int64(len(b)) > maxPayload {
		return []problem{lp.problem("files", fmt.Sprintf("the payload is %d bytes compressed, over the cap of %d bytes", len(b), maxPayload))}
	}
	if msg := checkBundleCommand(b, lp.spec.Command); msg != "" {
		return []problem{lp.problem("command[0]", msg)}
	}
	lp.bundle = b
	lp.digest = manifest.Digest(b)
	return nil
}

// describeBundleError shortens absolute paths in errors to paths relative
// to the pipe's file.
func describeBundleError(err error, dir string) string {
	return strings.ReplaceAll(err.Error(), dir+string(filepath.Separator), "")
}

// checkBundleCommand checks that a relative command[0] with a slash names an
// executable file in the bundle, as the server does. The bundle was built
// here, so only the server's limits are left for the server to check.
func checkBundleCommand(b []byte, command []string) string {
	prog, ok := manifest.BundleProgram(command)
	if !ok {
		return ""
	}
	entries, err := manifest.ScanBundle(b, manifest.UnpackLimits{MaxFiles: math.MaxInt, MaxBytes: math.MaxInt64})
	if err != nil {
		return "cannot read the bundle: " + err.Error()
	}
	switch e := manifest.FindEntry(entries, prog); {
	case e == nil:
		return fmt.Sprintf("%q is not a file in the payload (list it, or its directory, under files:)", command[0])
	case e.Dir:
		return fmt.Sprintf("%q is a directory in the payload", command[0])
	case !e.Exec:
		return fmt.Sprintf("%q is not executable (chmod +x it)", command[0])
	}
	return ""
}

// sortProblems orders problems by file, then line.
func sortProblems(ps []problem) {
	sort.SliceStable(ps, func(i, j int) bool {
		if ps[i].file != ps[j].file {
			return ps[i].file < ps[j].file
		}
		return ps[i].line < ps[j].line
	})
}

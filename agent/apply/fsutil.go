package apply

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/drover/drover/internal/atomicfile"
	"golang.org/x/sys/unix"
)

// tmpPrefix starts the name of every temporary file apply creates next to its
// target. systemd ignores hidden files in unit directories; the next apply
// removes leftovers.
const tmpPrefix = ".drover-tmp-"

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// umask is the process's file mode creation mask, read once at start.
var umask = func() int {
	m := unix.Umask(0o022)
	unix.Umask(m)
	return m
}()

// mkdirMode creates dir with exactly perm, whatever the umask.
func mkdirMode(dir string, perm fs.FileMode) error {
	if err := os.Mkdir(dir, perm); err != nil {
		return err
	}
	if int(perm)&umask != 0 {
		return os.Chmod(dir, perm)
	}
	return nil
}

// writeFileMode writes a new file with exactly perm, whatever the umask.
func writeFileMode(path string, data []byte, perm fs.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, perm)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil && int(perm)&umask != 0 {
		err = f.Chmod(perm)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// fixModes sets directories to 0755 and files to 0644, or 0755 when
// executable by their owner.
func fixModes(root string) error {
	return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		mode := fs.FileMode(0o644)
		if d.IsDir() || info.Mode()&0o100 != 0 {
			mode = 0o755
		}
		return os.Chmod(p, mode)
	})
}

// pendingFile is a file written under a temporary name, waiting for rename.
type pendingFile struct {
	tmp, path string
}

// writeTemp writes data to a new temporary file next to path, without
// syncing it (see commitFiles).
func writeTemp(path string, data []byte, perm fs.FileMode) (pendingFile, error) {
	tmp := filepath.Join(filepath.Dir(path), tmpPrefix+filepath.Base(path)+"-"+randHex(4))
	if err := writeFileMode(tmp, data, perm); err != nil {
		os.Remove(tmp)
		return pendingFile{}, err
	}
	return pendingFile{tmp: tmp, path: path}, nil
}

// commitFiles makes the temporary files durable with one syncfs per file
// system, renames each over its target, then syncs the directories. A crash
// at any point leaves every target either old or new, complete.
func commitFiles(files []pendingFile) error {
	if len(files) == 0 {
		return nil
	}
	dirs := map[string]bool{}
	for _, f := range files {
		dirs[filepath.Dir(f.path)] = true
	}
	if err := syncFS(dirs); err != nil {
		return err
	}
	var errs []error
	for _, f := range files {
		if err := os.Rename(f.tmp, f.path); err != nil {
			os.Remove(f.tmp)
			errs = append(errs, err)
		}
	}
	for d := range dirs {
		if err := atomicfile.SyncDir(d); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// writeFileAtomic replaces path (see internal/atomicfile). Its temporary
// file starts with tmpPrefix, so removeTemps sweeps it after a crash.
func writeFileAtomic(path string, data []byte, perm fs.FileMode) error {
	return atomicfile.Options{Perm: perm, TempPrefix: tmpPrefix + filepath.Base(path) + "-"}.Write(path, data)
}

// replaceFile is writeFileAtomic without the directory sync: the caller
// syncs the directory once for several files.
func replaceFile(path string, data []byte, perm fs.FileMode) error {
	return atomicfile.Options{Perm: perm, TempPrefix: tmpPrefix + filepath.Base(path) + "-", NoDirSync: true}.Write(path, data)
}

// syncFS flushes the file systems holding dirs: one syncfs(2) per file system.
func syncFS(dirs map[string]bool) error {
	seen := map[uint64]bool{}
	for d := range dirs {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return err
		}
		if seen[st.Dev] {
			continue
		}
		seen[st.Dev] = true
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return err
		}
		err = unix.Syncfs(fd)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("syncfs %s: %w", d, err)
		}
	}
	return nil
}

// removeTemps deletes leftovers of an interrupted write in dir.
func removeTemps(dir string) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// ensureDir creates dir (and parents) and sets its mode.
func ensureDir(dir string, perm fs.FileMode) error {
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	return os.Chmod(dir, perm)
}

package benchutil

import (
	"fmt"
	"os"
)

// Publish prints a benchmark's report to stdout and, when out is set,
// writes its markdown form there with write (WriteMarkdown if nil).
func Publish(text, markdown, out string, write func(file, markdown string) error) error {
	fmt.Print("\n" + text)
	if out == "" {
		return nil
	}
	if write == nil {
		write = WriteMarkdown
	}
	if err := write(out, markdown); err != nil {
		return err
	}
	Step("wrote %s", out)
	return nil
}

// WriteMarkdown writes markdown to file, replacing what it held.
func WriteMarkdown(file, markdown string) error {
	return os.WriteFile(file, []byte(markdown), 0o644)
}

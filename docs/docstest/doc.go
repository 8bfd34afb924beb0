// Package docstest checks the project's Markdown documentation (README.md and docs/) against the
// tree it describes: relative links and their anchors resolve, every `make` target it names exists,
// the package map in docs/architecture.md matches the import graph, and the front page stays short.
// It has no code of its own; the checks are its tests.
package docstest

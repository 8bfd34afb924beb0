# One image for every component (kubelet plugin, webhook, kubectl-dra), built the same way as
# `make build`. The local harness assembles the identical image without Docker (e2e/cluster/images.sh).
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /src/_output/bin/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/gpu-webhook"]

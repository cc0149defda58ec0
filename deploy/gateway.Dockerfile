# SGLang Model Gateway (PyPI sglang-router, the `smg` binary), the version
# tests/gateway/test_gateway.py runs: `docker build -f deploy/gateway.Dockerfile -t hearth-gateway:local deploy`
FROM python:3.11-slim
RUN pip install --no-cache-dir sglang-router==0.3.2
EXPOSE 30000
ENTRYPOINT ["smg"]

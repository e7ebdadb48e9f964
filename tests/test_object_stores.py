"""GCS and Azure Blob for real, on emulators started by the tests (tests/support/emulators.py).

* Round trips: a savepoint of a running query's checkpoint taken onto fake-gcs-server (gs://) and
  onto Azurite (abfs://), restored, the query continued; its output equals an uninterrupted run's.
* Probes: what each emulator does with the preconditions the object-store back ends rely on
  (exclusive create, guarded copies, the store's own checksums). docs/reliability.md lists the
  findings; a probe that fails means the emulator changed, and the docs with it.
"""

from __future__ import annotations

import base64

import fsspec
import google_crc32c
import pytest

from airflow_savepoints.core.models import MANIFEST_FILE
from tests.support.emulators import azurite_blob_service
from tests.test_roundtrip import round_trip

SHAPES_ON_OBJECT_STORES = ["rocksdb_v2", "transform_with_state"]


# --- round trips ----------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", SHAPES_ON_OBJECT_STORES)
@pytest.mark.parametrize("scheme,protocol,root", [
    pytest.param("gs", "gcs", "gcs_bucket", marks=pytest.mark.gcs, id="gcs"),
    pytest.param("abfs", "abfs", "azure_container", marks=pytest.mark.azure, id="azure"),
])
def test_round_trip_with_savepoints_on_gcs_and_azure(spark, references, name, tmp_path, request,
                                                     scheme, protocol, root):
    bucket = request.getfixturevalue(root)
    combined, summary, _ = round_trip(spark, name, tmp_path, f"{scheme}://{bucket}/savepoints")
    assert summary["pointer"].startswith(f"{scheme}://{bucket}/savepoints/{name}/savepoint-")
    folder = summary["pointer"].removeprefix(f"{scheme}://")
    stored = fsspec.filesystem(protocol, skip_instance_cache=True).find(folder)
    assert f"{folder}/{MANIFEST_FILE}" in stored and len(stored) >= summary["files"]
    assert combined == references(name)


# --- fake-gcs-server: what it does with GCS's preconditions and checksums ---------------------------------
def _gcs():
    return fsspec.filesystem("gcs", skip_instance_cache=True)


def _crc32c_b64(data: bytes) -> str:
    return base64.b64encode(google_crc32c.value(data).to_bytes(4, "big")).decode()


@pytest.mark.gcs
def test_fake_gcs_honours_if_generation_match_0_on_a_multipart_upload(gcs_bucket):
    fs, path = _gcs(), f"{gcs_bucket}/jobs/j/_lease"
    fs.pipe_file(path, b"first", mode="create")  # gcsfs: a multipart upload with ifGenerationMatch=0
    with pytest.raises(FileExistsError):  # 412 from the emulator, as from GCS
        fs.pipe_file(path, b"second", mode="create")
    assert fs.cat_file(path) == b"first"


@pytest.mark.gcs
def test_fake_gcs_ignores_if_generation_match_0_on_resumable_and_media_uploads(gcs_bucket):
    """A gap of the emulator (GCS answers 412 to both): exclusive create is testable here only as a
    multipart upload, i.e. for objects under gcsfs's 50 MiB single-request limit (leases, catalogs)."""
    fs, path = _gcs(), f"{gcs_bucket}/taken"
    fs.pipe_file(path, b"first")
    fs.pipe_file(path, b"r" * (300 * 1024), mode="create", chunksize=256 * 1024)  # resumable: not refused
    assert fs.cat_file(path) == b"r" * (300 * 1024)
    fs.call("POST", f"{fs._location}/upload/storage/v1/b/{gcs_bucket}/o", uploadType="media", name="taken",
            ifGenerationMatch="0", data=b"media", json_out=True)  # media upload: not refused either
    assert fs.cat_file(path) == b"media"


@pytest.mark.gcs
@pytest.mark.parametrize("verb", ["rewriteTo", "copyTo"])
def test_fake_gcs_ignores_if_source_generation_match_on_copies(gcs_bucket, verb):
    """A gap of the emulator (GCS answers 412): a guarded copy of a replaced source copies the new
    bytes here, so a test of 'source rewritten during a copy' cannot rely on the precondition."""
    fs, source = _gcs(), f"{gcs_bucket}/state/0/1.changelog"
    fs.pipe_file(source, b"v1")
    listed_generation = fs.info(source)["generation"]
    fs.pipe_file(source, b"v2")  # rewritten after it was listed
    assert fs.info(source)["generation"] != listed_generation
    fs.call("POST", "b/{}/o/{}/" + verb + "/b/{}/o/{}", gcs_bucket, "state/0/1.changelog", gcs_bucket, "copy",
            ifSourceGenerationMatch=listed_generation, json_out=True)
    assert fs.cat_file(f"{gcs_bucket}/copy") == b"v2"
    fs.call("POST", "b/{}/o/{}/" + verb + "/b/{}/o/{}", gcs_bucket, "state/0/1.changelog", gcs_bucket, "copy",
            ifGenerationMatch="0", json_out=True)  # an exclusive copy onto an existing target: not refused


@pytest.mark.gcs
def test_fake_gcs_keeps_the_crc32c_of_every_object_in_listings_and_copies(gcs_bucket):
    fs = _gcs()
    small, large = b"s" * 1000, bytes(range(256)) * 1200  # multipart and resumable (chunked) uploads
    fs.pipe_file(f"{gcs_bucket}/a/small", small)
    fs.pipe_file(f"{gcs_bucket}/a/large", large, chunksize=256 * 1024)
    fs.copy(f"{gcs_bucket}/a/large", f"{gcs_bucket}/b/large")  # rewriteTo, inside the store
    listing = fs.find(gcs_bucket, detail=True)  # one listing carries every object's CRC32C
    assert listing[f"{gcs_bucket}/a/small"]["crc32c"] == _crc32c_b64(small)
    assert listing[f"{gcs_bucket}/a/large"]["crc32c"] == _crc32c_b64(large)
    assert listing[f"{gcs_bucket}/b/large"]["crc32c"] == _crc32c_b64(large)
    assert listing[f"{gcs_bucket}/a/large"]["generation"] != listing[f"{gcs_bucket}/b/large"]["generation"]


# --- Azurite: what it does with Azure's preconditions and checksums ---------------------------------------
@pytest.mark.azure
def test_azurite_honours_if_none_match_star_on_put_and_on_block_list_commit(azure_emulator, azure_container):
    from azure.core.exceptions import ResourceExistsError

    fs, path = fsspec.filesystem("abfs", skip_instance_cache=True), f"{azure_container}/jobs/j/_lease"
    fs.pipe_file(path, b"first", mode="create")  # adlfs: Put Blob with If-None-Match: *
    with pytest.raises(FileExistsError):  # 409 BlobAlreadyExists
        fs.pipe_file(path, b"second", mode="create")
    assert fs.cat_file(path) == b"first"
    blocks = azurite_blob_service(azure_emulator.url, max_single_put_size=1024 * 1024, max_block_size=1024 * 1024)
    blob = blocks.get_blob_client(azure_container, "big")
    blob.upload_blob(b"1" * (3 * 1024 * 1024))  # Put Block x3, Put Block List
    with pytest.raises(ResourceExistsError):
        blob.upload_blob(b"2" * (3 * 1024 * 1024), overwrite=False)  # the commit carries If-None-Match: *
    assert blob.download_blob().readall()[:1] == b"1"


@pytest.mark.azure
@pytest.mark.parametrize("requires_sync", [False, True], ids=["copy-blob", "copy-blob-from-url"])
def test_azurite_honours_the_source_etag_on_copies(azure_emulator, azure_container, requires_sync):
    from azure.core import MatchConditions
    from azure.core.exceptions import HttpResponseError, ResourceExistsError

    service = azurite_blob_service(azure_emulator.url)
    source = service.get_blob_client(azure_container, "state/0/1.changelog")
    source.upload_blob(b"v1")
    listed_etag = source.get_blob_properties().etag
    source.upload_blob(b"v2", overwrite=True)  # rewritten after it was listed
    target = service.get_blob_client(azure_container, "copy")
    with pytest.raises(HttpResponseError) as refused:
        target.start_copy_from_url(source.url, requires_sync=requires_sync, source_etag=listed_etag,
                                   source_match_condition=MatchConditions.IfNotModified)
    assert refused.value.status_code == 412  # Azurite says ConditionNotMet (Azure: SourceConditionNotMet)
    assert not target.exists()
    current = source.get_blob_properties().etag
    copied = target.start_copy_from_url(source.url, requires_sync=requires_sync, source_etag=current,
                                        source_match_condition=MatchConditions.IfNotModified)
    assert copied["copy_status"] == "success" and target.download_blob().readall() == b"v2"
    with pytest.raises(ResourceExistsError):  # an exclusive copy (If-None-Match: * on the target)
        target.start_copy_from_url(source.url, requires_sync=requires_sync, match_condition=MatchConditions.IfMissing)


@pytest.mark.azure
def test_azurite_keeps_content_md5_for_single_puts_and_copies_not_for_block_lists(azure_emulator, azure_container):
    import hashlib

    service = azurite_blob_service(azure_emulator.url, max_single_put_size=1024 * 1024, max_block_size=1024 * 1024)
    small, large = b"s" * 1000, b"l" * (3 * 1024 * 1024)
    service.get_blob_client(azure_container, "small").upload_blob(small)
    service.get_blob_client(azure_container, "large").upload_blob(large)  # staged blocks
    target = service.get_blob_client(azure_container, "small-copy")
    target.start_copy_from_url(service.get_blob_client(azure_container, "small").url, requires_sync=True)
    md5 = {name: service.get_blob_client(azure_container, name).get_blob_properties().content_settings.content_md5
           for name in ("small", "small-copy", "large")}
    assert bytes(md5["small"]) == hashlib.md5(small).digest() == bytes(md5["small-copy"])
    assert md5["large"] is None  # as on Azure: a block-list blob has no whole-object MD5 unless the writer sets one
    listed = fsspec.filesystem("abfs", skip_instance_cache=True).find(azure_container, detail=True)
    assert bytes(listed[f"{azure_container}/small"]["content_settings"]["content_md5"]) == hashlib.md5(small).digest()


# --- one process, two savepoints of a checkpoint that moved on ------------------------------------------------


@pytest.mark.parametrize("kind", [
    pytest.param("s3", marks=pytest.mark.s3),  # Store.list_files forgets s3fs's cached subfolder listings
    pytest.param("gcs", marks=pytest.mark.gcs),  # gcsfs and adlfs do not answer info() from a parent's cached listing
    pytest.param("azure", marks=pytest.mark.azure),
])
def test_second_savepoint_in_one_process_sees_the_checkpoints_new_batch(kind, request, tmp_path):
    from airflow_savepoints.core import take_savepoint
    from tests.support.synthetic import write_checkpoint

    protocol, url = {"s3": ("s3", "s3://{}"), "gcs": ("gcs", "gs://{}"), "azure": ("abfs", "abfs://{}")}[kind]
    bucket = request.getfixturevalue({"s3": "s3", "gcs": "gcs_bucket", "azure": "azure_container"}[kind])
    spark_side = fsspec.filesystem(protocol, skip_instance_cache=True)  # the writer: another client, like Spark
    local = write_checkpoint(tmp_path / "checkpoint", batches=3)
    spark_side.put(f"{local}/", f"{bucket}/checkpoint", recursive=True)
    checkpoint, savepoints = url.format(f"{bucket}/checkpoint"), url.format(f"{bucket}/savepoints")
    first = take_savepoint(checkpoint, "j", savepoint_dir=savepoints)
    assert first.manifest.batch_id == 2
    later = write_checkpoint(tmp_path / "later", batches=4)  # the query committed batch 3 meanwhile
    for rel in ("offsets/3", "commits/3", "sources/0/3", "state/0/0/4.delta", "state/0/1/4.delta"):
        spark_side.pipe_file(f"{bucket}/checkpoint/{rel}", (later / rel).read_bytes())
    second = take_savepoint(checkpoint, "j", savepoint_dir=savepoints)
    assert second.manifest.batch_id == 3
